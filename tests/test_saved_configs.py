"""Pipelines saved by earlier releases keep loading, accelerated as they were recorded.

The fixtures are the ``[nlp.after_pipeline_creation]`` sections that ``nlp.to_disk``
wrote after ``optimize(nlp, "cpu", "fp32", tolerance=5e-4, threads=1, warmup=False)``
(and ``lock_timeout=120`` for v2): v1 by the first release, v2 by the release before the
package layout of issue 19. They are spliced into a plain saved pipeline, which must then
load accelerated with exactly those options and annotate as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from thinc.api import Config

import spacy_accelerate

FIXTURES = Path(__file__).parent / "fixtures"


def _with_saved_section(plain: Path, fixture: str, target: Path) -> Path:
    nlp = spacy.load(plain)
    nlp.to_disk(target)
    config = Config().from_disk(target / "config.cfg", interpolate=False)
    section = Config().from_str("[nlp]\n" + (FIXTURES / fixture).read_text(), interpolate=False)
    config["nlp"]["after_pipeline_creation"] = section["nlp"]["after_pipeline_creation"]
    config.to_disk(target / "config.cfg")
    return target


@pytest.mark.parametrize(
    ("fixture", "lock_timeout"),
    [
        ("saved_v1_after_pipeline_creation.cfg", None),
        ("saved_v2_after_pipeline_creation.cfg", 120.0),
    ],
)
def test_a_pipeline_saved_by_an_earlier_release_loads_accelerated_as_recorded(
    fixture: str,
    lock_timeout: float | None,
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    tmp_path: Path,
    ewt_texts: list[str],
) -> None:
    saved = _with_saved_section(sample_path("bert"), fixture, tmp_path / "saved")
    assert spacy.load(saved).config["nlp"]["after_pipeline_creation"]["@callbacks"] in (
        "spacy_accelerate.optimize.v1",
        "spacy_accelerate.optimize.v2",
    )
    nlp = spacy.load(saved)
    assert spacy_accelerate.is_optimized(nlp)
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    config = proxy.session.config
    assert (config.provider.value, config.precision.value) == ("cpu", "fp32")
    assert config.tolerance == pytest.approx(5e-4)
    assert config.intra_op_threads == 1
    assert config.warmup is False
    if lock_timeout is not None:
        assert config.lock_timeout == lock_timeout

    plain = spacy.load(sample_path("bert"))
    texts = ewt_texts[:40]
    expected = [[(t.tag_, t.dep_, t.head.i, t.ent_type_) for t in d] for d in plain.pipe(texts)]
    actual = [[(t.tag_, t.dep_, t.head.i, t.ent_type_) for t in d] for d in nlp.pipe(texts)]
    assert actual == expected
