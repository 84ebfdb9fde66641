"""OpenVINO bf16 with its last layers in fp32: the annotations' agreement with PyTorch fp32.

    python benchmarks/openvino_bf16_f32_layers.py --pipeline trf-base --f32-layers 0 3 4 5 6

An experiment, not a served mode: the bf16 IR is split at a layer boundary
into a head compiled with the bf16 hint and a tail (the last ``N`` layers)
compiled with f32, chained through the hidden state between them, and put in
place of the served session's inference. The pipeline then runs over the
UD-EWT test documents ``benchmarks/run.py`` uses; the report gives the
agreement of tags, dependencies and entities with PyTorch fp32 and the
seconds of one pass per split (passes in turn, not alternating with PyTorch).
It measures whether keeping some layers in fp32 brings bf16 to the issue's
99.9% agreement, and at what cost.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import spacy_accelerate  # noqa: E402
from spacy_accelerate.benchmark import agreement, write_report  # noqa: E402
from spacy_accelerate.openvino_runtime import IR_FILE, import_openvino  # noqa: E402
from spacy_accelerate.samples import ewt  # noqa: E402
from spacy_accelerate.samples.trained import load_benchmark_pipeline  # noqa: E402

#: The name of the hidden state the tail model reads.
CARRIED = "carried_hidden_state"


def split(core: Any, ir: str, names: list[str], head_layers: int) -> tuple[Any, Any]:
    """The head (embeddings and the first ``head_layers`` layers) and the tail models."""
    ov = import_openvino()
    head = core.read_model(ir)
    kept = [
        r for r in head.get_results() if r.input_value(0).get_any_name() in names[: head_layers + 1]
    ]
    tail = core.read_model(ir)
    results = {r.input_value(0).get_any_name(): r for r in tail.get_results()}
    boundary = results[names[head_layers]].input_value(0)
    width = boundary.get_partial_shape()[2]
    carried = ov.opset13.parameter(ov.PartialShape([-1, -1, width]), ov.Type.f32, name=CARRIED)
    carried.output(0).get_tensor().set_names({CARRIED})
    for target in list(boundary.get_target_inputs()):
        if target.get_node().get_type_name() != "Result":
            target.replace_source_output(carried.output(0))
    tail_results = [results[name] for name in names[head_layers + 1 :]]
    return (
        ov.Model(kept, head.get_parameters(), "head"),
        ov.Model(tail_results, [carried, *tail.get_parameters()], "tail"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="trf-base")
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--f32-layers", type=int, nargs="+", default=[0, 3, 4, 5, 6])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    nlp = load_benchmark_pipeline(args.pipeline)
    gold = ewt.load_documents(
        "test", max_sentences=8, limit_sentences=args.sentences, vocab=nlp.vocab
    )
    texts = [doc.text for doc in gold]
    expected = list(nlp.pipe(texts, batch_size=64))
    cache = tempfile.mkdtemp()
    spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache, warmup=False)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    ir = str(proxy.exported.path / IR_FILE)
    names = list(proxy.spec.hidden_state_names)
    core = import_openvino().Core()
    settings = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    report: dict[str, Any] = {"pipeline": args.pipeline, "splits": {}}
    for f32_layers in args.f32_layers:
        head_layers = len(names) - 1 - f32_layers
        head, tail = split(core, ir, names, head_layers)
        first = core.compile_model(head, "CPU", {**settings, "INFERENCE_PRECISION_HINT": "bf16"})
        second = core.compile_model(tail, "CPU", {**settings, "INFERENCE_PRECISION_HINT": "f32"})
        requests = (first.create_infer_request(), second.create_infer_request())
        inputs = ([p.any_name for p in first.inputs], [p.any_name for p in second.inputs])

        def run_whole(feeds, outputs, requests=requests, inputs=inputs, cut=head_layers):
            requests[0].infer({name: feeds[name] for name in inputs[0]})
            carried = requests[0].get_tensor(names[cut]).data
            requests[1].infer({n: carried if n == CARRIED else feeds[n] for n in inputs[1]})
            return [
                requests[0 if names.index(name) <= cut else 1].get_tensor(name).data
                for name in outputs
            ]

        proxy.session.runner.run_whole = run_whole
        list(nlp.pipe(texts, batch_size=64))  # warm-up
        start = time.perf_counter()
        docs = list(nlp.pipe(texts, batch_size=64))
        seconds = time.perf_counter() - start
        found = agreement(expected, docs)
        report["splits"][f"{f32_layers} of {len(names) - 1} layers fp32"] = {
            "agreement": {key: round(found.rate(key), 5) for key in found.same},
            "tokens": found.tokens,
            "seconds": round(seconds, 2),
        }
        print(f32_layers, report["splits"], flush=True)
    write_report(report, args.output)


if __name__ == "__main__":
    main()
