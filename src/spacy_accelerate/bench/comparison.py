"""What ``spacy-accelerate bench`` measures and reports: the pipeline on the user's texts,
PyTorch fp32 and each precision asked side by side (:mod:`.side_by_side`), each one's
agreement with PyTorch as the accuracy gate counts it, where the time goes for the first
precision that ran (:mod:`.where_time_goes`), and, with gold annotations, every variant's
scores against them (:mod:`.gold`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.bench import where_time_goes
from spacy_accelerate.bench.baselines import Accelerated
from spacy_accelerate.bench.gold import score
from spacy_accelerate.bench.side_by_side import SideBySide, side_by_side
from spacy_accelerate.bench.where_time_goes import WhereTimeGoes
from spacy_accelerate.verify.agreement import AgreementReport, compare


@dataclass(frozen=True)
class Comparison:
    """One ``bench`` run: the side-by-side timings, each variant that ran's agreement
    with PyTorch, where the time goes, and the scores against gold (None and empty
    without gold)."""

    result: SideBySide
    agreements: dict[str, AgreementReport]
    stages: WhereTimeGoes | None
    pytorch_scores: dict[str, float | None] | None = None
    scores: dict[str, dict[str, float | None]] = field(default_factory=dict)
    gold_documents: int = 0

    def report(
        self, failed: Mapping[str, str], calibration_file: Path | None, gold_file: Path | None
    ) -> dict[str, Any]:
        """The JSON report: side by side's, with ``failed`` (the refused variants' reasons,
        as the command worded them), where the time goes, the calibration file named in
        place of its texts, and the gold file and scores."""
        report = self.result.as_dict()
        report["failed"] = dict(failed)
        if self.stages is not None:
            report["where_time_goes"] = self.stages.as_dict()
        for described in report["variants"].values():
            given = described["options"].pop("calibration_texts", None)
            if given is not None:  # the file, not its texts, belongs in the report
                described["options"]["calibration_file"] = str(calibration_file)
        if self.pytorch_scores is not None:
            report["gold"] = {"file": str(gold_file), "documents": self.gold_documents}
            report["pytorch"]["gold"] = self.pytorch_scores
            for name in self.result.variants:
                report["variants"][name]["gold"] = self.scores[name]
        return report


def compare_precisions(
    nlp: Language,
    texts: Sequence[str],
    variants: Mapping[str, Mapping[str, Any]],
    *,
    gold: Sequence[Doc] = (),
    batch_size: int = 64,
    repeats: int = 3,
    refusals: tuple[type[Exception], ...] = (),
) -> Comparison:
    """Run ``variants`` (``optimize()``'s keyword arguments by name) beside PyTorch fp32
    on ``texts``; a variant whose switching raises one of ``refusals`` is reported as
    failed while the others run. ``gold``, where given, holds the documents ``texts``
    are the texts of, to score every variant against."""
    result = side_by_side(
        nlp, texts, variants, batch_size=batch_size, repeats=repeats, refusals=refusals
    )
    ran = next(iter(result.variants), None)
    stages = (
        where_time_goes.measure(nlp, texts, ran, Accelerated(variants[ran]), batch_size)
        if ran is not None
        else None
    )
    ran_docs = {name: variant.docs for name, variant in result.variants.items()}
    return Comparison(
        result,
        {name: compare(result.reference, docs) for name, docs in ran_docs.items()},
        stages,
        score(result.reference, gold) if gold else None,
        {name: score(docs, gold) for name, docs in ran_docs.items()} if gold else {},
        len(gold),
    )
