"""How ONNX Runtime's int8 model is made for a CPU: part of the cache key, so it is read
at every load; kept apart from :mod:`.quantize`, which imports ``onnx`` and runs only when
a model is built."""

from __future__ import annotations

from dataclasses import dataclass

from spacy_accelerate.cpu_features import CpuFeatures
from spacy_accelerate.verify.plan_search import SEARCH_RULE

#: Calibration rows each MatMul's harm is measured on, one from each of as many items spread
#: over the texts (their genres), each without its padding: the ladder needs only which
#: MatMuls harm most, and each one costs a run of the model over them. Two rows keep the
#: most harmful as four do, as four keep eight's (measured by ``benchmarks/harm_rows.py``:
#: ``benchmarks/results/harm_rows-epyc-2cpu-2026-12-04.json``, ``docs/accuracy.md``).
HARM_ROWS = 2


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 model is made; part of the cache key."""

    #: One scale per output channel of each weight instead of one per tensor.
    per_channel: bool = True
    #: 7-bit weights, where the CPU's int8 products saturate (see
    #: :func:`recipe_for`); 8-bit elsewhere.
    reduce_range: bool = False
    #: Apply ONNX Runtime's transformer fusions (fused attention) before quantizing.
    fuse_first: bool = False
    #: The block sizes of the blockwise plans, coarsest (fastest) first.
    blocks: tuple[int, ...] = (128, 32)
    #: How the plans are searched (part of the key: a changed search may serve another
    #: plan).
    ladder: str = SEARCH_RULE
    #: The calibration rows each MatMul's harm is measured on (:func:`matmul_harm`): they
    #: rank the ladder's units.
    harm_rows: int = HARM_ROWS


DEFAULT_INT8_RECIPE = Int8Recipe()


def recipe_for(cpu: CpuFeatures) -> Int8Recipe:
    """The recipe for ``cpu``: 7-bit weights on an x86 CPU without VNNI, where ONNX
    Runtime's u8 x s8 products saturate (its quantization guide recommends
    ``reduce_range`` there): with 8-bit weights on such a CPU no plan kept every real
    piece within the cosine gate, with 7-bit weights the same plan did (measured:
    ``docs/hardware.md``, "7-bit weights")."""
    return Int8Recipe(reduce_range=cpu.int8_products_saturate)
