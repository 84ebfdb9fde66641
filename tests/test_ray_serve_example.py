"""``examples/ray_serve.py`` serves a saved accelerated pipeline on Ray Serve (issue 61 item
2): on a local Ray, two replicas answer over HTTP with the annotations the pipeline gives
each text alone, concurrent requests batched; bad input is a 400 saying why.

Ray imports the example's modules on its replicas from the examples folder (the runtime
environment's ``working_dir``), as ``serve run --working-dir examples`` does.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import spacy
from at_once import at_once, start_local_ray
from ray import serve

import spacy_accelerate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.slow  # a Ray instance, Serve's controller and proxy: a minute


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def saved(sample_path: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BERT sample, accelerated for single documents, saved with its models bundled."""
    folder = tmp_path_factory.mktemp("ray-serve")
    nlp = spacy.load(sample_path("bert"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", workload="documents", cache_dir=folder / "c")
    nlp.to_disk(folder / "saved")
    return folder / "saved"


@pytest.fixture(scope="module")
def served(saved: Path) -> Iterator[tuple[str, Any]]:
    """The example's application on a local Ray (two CPUs, two replicas of one CPU each):
    its URL and the example's module."""
    sys.path.insert(0, str(EXAMPLES))
    start_local_ray(runtime_env={"working_dir": str(EXAMPLES)})
    try:
        import ray_serve

        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_serve.build_app({"pipeline": str(saved)}), name="annotate")
        yield f"http://127.0.0.1:{port}/", ray_serve
    finally:
        serve.shutdown()
        ray.shutdown()
        sys.path.remove(str(EXAMPLES))


def test_replicas_answer_concurrent_requests_as_the_pipeline_annotates_each_alone(
    served: tuple[str, Any], saved: Path, ewt_texts: list[str]
):
    url, example = served
    texts = [text for text in ewt_texts if len(text) < 400][:16]
    nlp = spacy.load(saved)
    expected = [
        {
            "tags": [t.tag_ for t in doc],
            "deps": [t.dep_ for t in doc],
            "heads": [t.head.i for t in doc],
            "entities": [[e.start_char, e.end_char, e.label_] for e in doc.ents],
        }
        for doc in (nlp(text) for text in texts)
    ]
    answers: list[Any] = [None] * len(texts)

    def post(index: int) -> None:
        answers[index] = httpx.post(url, json={"text": texts[index]}, timeout=120)

    at_once(post, len(texts))
    assert [answer.status_code for answer in answers] == [200] * len(texts)
    got = [answer.json() for answer in answers]
    assert [
        {
            "tags": body["tags"],
            "deps": body["deps"],
            "heads": body["heads"],
            "entities": [[e["start_char"], e["end_char"], e["label"]] for e in body["entities"]],
        }
        for body in got
    ] == expected
    assert set(got[0]) == set(example.FIELDS)


def test_bad_input_is_a_400_saying_why(served: tuple[str, Any]):
    url, _ = served
    empty = httpx.post(url, json={"text": "  "}, timeout=120)
    assert empty.status_code == 400 and "nothing to annotate" in empty.json()["error"]
    assert httpx.post(url, content=b"not json", timeout=120).status_code == 400
    assert httpx.post(url, json={"text": 3}, timeout=120).status_code == 400
