"""The trained reference pipelines build offline and score as recorded on UD-EWT test.

Every accuracy default of the library is checked on them, so a reference whose build drifted
(other heads, another encoder, another head design) must fail here rather than move those
verdicts unnoticed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spacy
from spacy_accelerate_samples.trained import (
    REFERENCES,
    TRAINING_RECORD,
    Reference,
    ensure_trained_sample,
    evaluate_on_ewt_test,
)
from spacy_curated_transformers.models.listeners import (
    last_transformer_layer_listener_forward,
    scalar_weighting_listener_forward,
)

#: Scoring both references on all of EWT test takes about a minute: the slow tier's.
pytestmark = pytest.mark.slow

#: Gold scores compared with the recorded ones, and how far (1 point) they may be off.
SCORES = ("tag_acc", "dep_uas", "dep_las", "ents_f")
TOLERANCE = 0.01


@pytest.mark.parametrize("reference", list(REFERENCES.values()), ids=list(REFERENCES))
def test_a_reference_builds_offline_and_scores_as_recorded(
    reference: Reference, samples_root: Path
) -> None:
    nlp = spacy.load(ensure_trained_sample(samples_root, reference.heads_dir))
    record = json.loads((reference.heads_dir / TRAINING_RECORD).read_text(encoding="utf8"))
    assert record["name"] == reference.name
    expected = (
        scalar_weighting_listener_forward
        if reference.training.all_layer_listeners
        else last_transformer_layer_listener_forward
    )
    listeners = list(nlp.get_pipe("transformer").listeners)
    assert len(listeners) == 3 and all(listener._func is expected for listener in listeners)
    widths = {nlp.get_pipe(head).model.get_ref("lower").get_dim("nI") for head in ("parser", "ner")}
    assert widths == {reference.training.parser_hidden_width, reference.training.ner_hidden_width}
    scores = evaluate_on_ewt_test(nlp)
    off = {key: round(scores[key] - record["test_scores"][key], 4) for key in SCORES}
    assert all(abs(difference) <= TOLERANCE for difference in off.values()), off
