"""Choosing a plan and timing it: PyTorch's references on the calibration texts and the
agreement gate, ``precision="auto"``'s search, the stage timings and the overlap plan.

The names below are what the API (:mod:`spacy_accelerate.api`) uses: the probe recorded
before anything is swapped, the agreement gate, ``auto``'s search and the overlap plan
(step 11)."""

from spacy_accelerate.planning.auto_precision import choose
from spacy_accelerate.planning.auto_search import Candidate, Choice
from spacy_accelerate.planning.judging import CalibrationSources, agreement_judge
from spacy_accelerate.planning.overlap_plan import plan_overlap
from spacy_accelerate.planning.recording import record_probe

__all__ = [
    "CalibrationSources",
    "Candidate",
    "Choice",
    "agreement_judge",
    "choose",
    "plan_overlap",
    "record_probe",
]
