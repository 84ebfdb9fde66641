"""Scale a saved accelerated pipeline out on Ray Serve: replicas that each annotate on their
share of the CPUs, the requests in flight batched by ``@serve.batch``.

Save the pipeline once, with its models bundled (replicas then load it with no export and
no timing)::

    spacy-accelerate optimize en_core_web_trf --precision auto --output ./trf-accelerated

then serve it on a Ray cluster (here, a local one) from this folder::

    pip install "spacy-accelerate[cpu,openvino]" "ray[serve]"
    serve run --working-dir examples ray_serve:build_app pipeline=$PWD/trf-accelerated replicas=2
    curl -s localhost:8000/ -d '{"text": "Apple is buying a U.K. startup."}'

Each replica reserves :data:`CPUS_PER_REPLICA` CPUs. Ray reserves them but pins nothing, so
the library's CPU budget is confined to them: the runtime's threads of several replicas on
one machine do not oversubscribe it. Requests that arrive while a replica annotates wait
for its next batch (``@serve.batch``, no wait timeout: a lone request starts at once), which
annotates them as one ``nlp.pipe`` batch; a text that fails fails its own request only
(:func:`spacy_accelerate.aio.annotate_each`). Texts are checked as ``web_service.py`` checks
them (its limits, its 400 answers saying why).
"""

from __future__ import annotations

import asyncio
from typing import Any

import spacy
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse
from web_service import text_in

from spacy_accelerate import cpu_budget
from spacy_accelerate.aio import annotate_each
from spacy_accelerate.ray.fields import doc_values

#: CPUs each replica reserves and annotates on.
CPUS_PER_REPLICA = 1
#: The most requests one batch annotates; more wait for the next.
MAX_BATCH = 64
#: The annotations a response holds (:data:`spacy_accelerate.ray.FIELDS` lists them all).
FIELDS = ("tags", "pos", "heads", "deps", "entities")


@serve.deployment(ray_actor_options={"num_cpus": CPUS_PER_REPLICA}, max_ongoing_requests=256)
class Annotator:
    """One replica: the pipeline loaded once, its requests annotated batch by batch."""

    def __init__(self, pipeline: str) -> None:
        # The module, not its BUDGET: Ray pickles this class by value, and the budget's lock
        # cannot be pickled (a replica confines its own process's budget).
        cpu_budget.BUDGET.confine(CPUS_PER_REPLICA)
        self.nlp = spacy.load(pipeline)

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.0)
    async def annotate(self, texts: list[str]) -> list[dict[str, Any]]:
        found = await asyncio.to_thread(annotate_each, self.nlp, list(texts))
        return [
            {"error": f"{type(doc).__name__}: {doc}"}
            if isinstance(doc, Exception)
            else doc_values(doc, FIELDS)
            for doc in found
        ]

    async def __call__(self, request: Request) -> JSONResponse:
        text = text_in(await request.body())
        if isinstance(text, JSONResponse):
            return text
        answer = await self.annotate(text)
        return JSONResponse(answer, status_code=500 if "error" in answer else 200)


def build_app(args: dict[str, str]) -> serve.Application:
    """The application ``serve run ray_serve:build_app pipeline=PATH [replicas=N]`` serves:
    the saved pipeline at ``PATH`` (required) on ``N`` replicas (default 2)."""
    if "pipeline" not in args:
        raise ValueError("say which pipeline to serve: pipeline=PATH after build_app")
    replicas = int(args.get("replicas", 2))
    return Annotator.options(num_replicas=replicas).bind(args["pipeline"])
