"""The trained reference pipelines build offline and score as recorded on UD-EWT test.

Every accuracy default of the library is checked on them, so a reference whose build drifted
(other heads, another encoder, another head design) must fail here rather than move those
verdicts unnoticed. The fast tier scores each on a committed subset (the first
``SUBSET_SENTENCES`` of EWT test, its scores recorded with the heads) and shows that those
scores move when the encoder breaks; the slow tier scores all of EWT test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spacy
import torch
from spacy.language import Language
from spacy_accelerate_samples.trained import (
    REFERENCES,
    SUBSET_SENTENCES,
    TRAINING_RECORD,
    Reference,
    ensure_trained_sample,
    evaluate_on_ewt_test,
)
from spacy_curated_transformers.models.listeners import (
    last_transformer_layer_listener_forward,
    scalar_weighting_listener_forward,
)

from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.shim import find_shim

#: Gold scores compared with the recorded ones, and how far (1 point) they may be off.
SCORES = ("tag_acc", "dep_uas", "dep_las", "ents_f")
TOLERANCE = 0.01


def _built(reference: Reference, samples_root: Path) -> tuple[Language, dict]:
    nlp = spacy.load(ensure_trained_sample(samples_root, reference.heads_dir))
    record = json.loads((reference.heads_dir / TRAINING_RECORD).read_text(encoding="utf8"))
    assert record["name"] == reference.name
    return nlp, record


def _off(scores: dict[str, float], recorded: dict[str, float]) -> dict[str, float]:
    return {key: round(scores[key] - recorded[key], 4) for key in SCORES}


@pytest.mark.parametrize("reference", list(REFERENCES.values()), ids=list(REFERENCES))
def test_a_reference_builds_offline_with_its_design_and_scores_as_recorded_on_the_subset(
    reference: Reference, samples_root: Path
) -> None:
    nlp, record = _built(reference, samples_root)
    expected = (
        scalar_weighting_listener_forward
        if reference.training.all_layer_listeners
        else last_transformer_layer_listener_forward
    )
    listeners = list(nlp.get_pipe("transformer").listeners)
    assert len(listeners) == 3 and all(listener._func is expected for listener in listeners)
    widths = {nlp.get_pipe(head).model.get_ref("lower").get_dim("nI") for head in ("parser", "ner")}
    assert widths == {reference.training.parser_hidden_width, reference.training.ner_hidden_width}
    off = _off(evaluate_on_ewt_test(nlp, SUBSET_SENTENCES), record["test_subset_scores"])
    assert all(abs(difference) <= TOLERANCE for difference in off.values()), off


def test_the_subset_scores_move_when_the_encoders_conversion_breaks(samples_root: Path) -> None:
    """What a conversion that transposes the attention's output projection (a square
    matrix, so every shape still fits) would do: the subset sees it, beyond the tolerance,
    in every score."""
    reference = next(iter(REFERENCES.values()))
    nlp, record = _built(reference, samples_root)
    module = find_shim(transformer_components(nlp)[0]).read_pytorch_module()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("mha.output.weight"):
                parameter.copy_(parameter.T.clone())
    off = _off(evaluate_on_ewt_test(nlp, SUBSET_SENTENCES), record["test_subset_scores"])
    assert all(difference < -TOLERANCE for difference in off.values()), off


@pytest.mark.slow
@pytest.mark.parametrize("reference", list(REFERENCES.values()), ids=list(REFERENCES))
def test_a_reference_scores_as_recorded_on_all_of_ewt_test(
    reference: Reference, samples_root: Path
) -> None:
    nlp, record = _built(reference, samples_root)
    off = _off(evaluate_on_ewt_test(nlp), record["test_scores"])
    assert all(abs(difference) <= TOLERANCE for difference in off.values()), off
