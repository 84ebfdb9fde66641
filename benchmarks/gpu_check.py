"""The GPU check: parity and speed of the CUDA and TensorRT providers on an NVIDIA GPU.

    python benchmarks/gpu_check.py                    # trf-base, defaults below
    python benchmarks/gpu_check.py --sentences 200 --device 1 --no-tensorrt

First it lists what a GPU run needs (a CUDA device visible to torch, cupy for
spaCy's GPU arrays, onnxruntime-gpu's CUDA provider, and for TensorRT its
provider and libraries). When something required is missing it says what to
install and exits with status 2, before building anything. Otherwise it
builds the ``trf-base`` sample (en_core_web_trf's shape, random weights),
runs it under ``spacy.require_gpu()`` and measures, side by side in one
process: PyTorch fp32 (the reference), PyTorch fp16 autocast, and
spacy-accelerate's cuda and tensorrt providers at fp32 and fp16 (and cuda
fp16 with CUDA graphs), for the full pipeline and for transformer + ner. Parity
checks (status 1 on failure): fp32 hidden states within 1e-3 of PyTorch's
(ONNX Runtime uses TF32), fp16 token cosine >= 0.999 and annotation
agreement >= 99.5%. Writes
``benchmarks/results/gpu-<gpu>-<date>.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
FP32_MAX_ABS = 1e-3
FP16_MIN_COSINE = 0.999
FP16_MIN_AGREEMENT = 0.995
AGREEMENT_KEYS = ("tag", "dep", "ent")


@dataclass(frozen=True)
class Requirement:
    name: str
    met: bool
    detail: str
    install: str
    required: bool = True


def _importable(module: str) -> tuple[bool, str]:
    try:
        imported = importlib.import_module(module)
    except Exception as error:  # a broken CUDA library raises more than ImportError
        return False, f"{type(error).__name__}: {error}"
    return True, str(getattr(imported, "__version__", "installed"))


def requirements(device: int, tensorrt: bool) -> list[Requirement]:
    """What a GPU run needs, and whether this machine has it."""
    import torch

    found: list[Requirement] = []
    cuda = torch.cuda.is_available() and device < torch.cuda.device_count()
    found.append(
        Requirement(
            f"CUDA device {device} visible to torch",
            cuda,
            torch.cuda.get_device_name(device) if cuda else f"torch {torch.__version__} sees none",
            "an NVIDIA GPU and driver, and a CUDA build of torch "
            "(pip install torch --index-url https://download.pytorch.org/whl/cu126)",
        )
    )
    ok, detail = _importable("cupy")
    found.append(
        Requirement("cupy (spaCy's GPU arrays)", ok, detail, "pip install 'spacy-accelerate[gpu]'")
    )
    ok, detail = _importable("onnxruntime")
    providers: list[str] = []
    if ok:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        detail = f"onnxruntime {onnxruntime.__version__}: {', '.join(providers)}"
    found.append(
        Requirement(
            "onnxruntime-gpu: CUDAExecutionProvider",
            "CUDAExecutionProvider" in providers,
            detail,
            "pip uninstall -y onnxruntime && pip install 'spacy-accelerate[gpu]'",
        )
    )
    found.append(
        Requirement(
            "onnxruntime-gpu: TensorrtExecutionProvider",
            "TensorrtExecutionProvider" in providers,
            detail,
            "pip install 'spacy-accelerate[tensorrt]'",
            required=tensorrt,
        )
    )
    ok, detail = _importable("tensorrt")
    found.append(
        Requirement(
            "TensorRT libraries (tensorrt)",
            ok,
            detail,
            "pip install 'spacy-accelerate[tensorrt]'",
            required=tensorrt,
        )
    )
    return found


def report_requirements(found: list[Requirement]) -> bool:
    """Print the list; True when everything required is there."""
    print("GPU check: what this machine has")
    for item in found:
        status = "ok" if item.met else ("MISSING" if item.required else "missing (optional)")
        print(f"  [{status}] {item.name}: {item.detail}")
        if not item.met:
            print(f"      install: {item.install}")
    missing = [item.name for item in found if item.required and not item.met]
    if missing:
        print(f"Cannot run the GPU check: missing {', '.join(missing)}.")
    return not missing


def variants(tensorrt: bool, device: int) -> dict[str, Any]:
    from spacy_accelerate.bench.baselines import Accelerated, PyTorchAutocast

    chosen: dict[str, Any] = {"pytorch fp16 autocast (gpu)": PyTorchAutocast("cuda", "float16")}
    providers = ["cuda", "tensorrt"] if tensorrt else ["cuda"]
    for provider in providers:
        for precision in ("fp32", "fp16"):
            options = {"provider": provider, "precision": precision, "device_id": device}
            chosen[f"accelerate {provider} {precision}"] = Accelerated(options)
    # The CUDA-graph path (CUDA provider only), checked for parity like any fp16 variant.
    graphs = {"provider": "cuda", "precision": "fp16", "device_id": device}
    graphs["gpu"] = {"cuda_graph": True}
    chosen["accelerate cuda fp16 cuda-graphs"] = Accelerated(graphs)
    return chosen


def parity(name: str, result: Any, reference: list, docs: list) -> dict[str, Any]:
    """The parity figures of one variant and whether they pass."""
    import numpy as np

    from spacy_accelerate.bench.doc_outputs import last_hidden_state

    rates = {key: result.agreement.rate(key) for key in AGREEMENT_KEYS}
    row: dict[str, Any] = {
        "min_token_cosine": result.min_token_cosine,
        "agreement": rates,
    }
    if name.endswith("fp32") and name.startswith("accelerate"):
        worst = max(
            float(np.max(np.abs(last_hidden_state(a) - last_hidden_state(b))))
            for a, b in zip(reference, docs, strict=True)
            if len(a)
        )
        row["max_abs_diff"] = worst
        row["passed"] = worst <= FP32_MAX_ABS
    elif "fp16" in name and name.startswith("accelerate"):
        row["passed"] = result.min_token_cosine >= FP16_MIN_COSINE and all(
            rate >= FP16_MIN_AGREEMENT for rate in rates.values()
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-tensorrt", action="store_true", help="CUDA provider only")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    tensorrt = not args.no_tensorrt

    found = requirements(args.device, tensorrt)
    if not report_requirements(found):
        return 2

    import spacy
    import torch
    from spacy_accelerate_samples import ewt
    from spacy_accelerate_samples.pipelines import ensure_sample

    from spacy_accelerate.bench.side_by_side import side_by_side
    from spacy_accelerate.export.fingerprint import package_versions
    from spacy_accelerate.pipeline.components import transformer_components

    spacy.require_gpu(args.device)
    nlp = spacy.load(ensure_sample("trf-base"))
    gold = ewt.load_documents("test", max_sentences=8, limit_sentences=args.sentences)
    texts = [doc.text for doc in gold]
    ner_only = [c.name for c in transformer_components(nlp)] + ["ner"]
    chosen = variants(tensorrt, args.device)
    gpu = torch.cuda.get_device_name(args.device)
    report: dict[str, Any] = {
        "gpu": gpu,
        "versions": package_versions(),
        "documents": len(texts),
        "modes": {},
    }
    passed = True
    for mode in ("full", "transformer+ner"):
        enabled = nlp.pipe_names if mode == "full" else ner_only
        print(f"[{datetime.now():%H:%M:%S}] trf-base {mode}", flush=True)
        with nlp.select_pipes(enable=enabled):
            result = side_by_side(
                nlp, texts, chosen, batch_size=args.batch_size, repeats=args.repeats
            )
        rows: dict[str, Any] = {"pytorch fp32": {"wps": result.pytorch_wps, "speedup": 1.0}}
        for name, variant in result.variants.items():
            row = {"wps": result.wps(name), "speedup": result.speedup(name)}
            row.update(parity(name, variant, result.reference, variant.docs))
            passed &= row.get("passed", True)
            rows[name] = row
            print(f"  {name}: {row['speedup']:.2f}x, {json.dumps(row, default=float)}")
        report["modes"][mode] = rows
    report["passed"] = passed
    args.output_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    output = args.output_dir / f"gpu-{slug}-{date}.json"
    output.write_text(json.dumps(report, indent=2, default=float))
    print(f"wrote {output}; parity {'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
