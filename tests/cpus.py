"""CPUs the tests simulate (:func:`spacy_accelerate.cpu_features.simulated`), so that every
branch of a hardware-dependent decision runs on whatever CPU the suite runs on."""

from __future__ import annotations

from spacy_accelerate.cpu_features import CpuFeatures

_AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}

#: An Intel Xeon with AMX (Sapphire Rapids and later): bf16 and int8 on AMX tiles.
AMX_XEON = CpuFeatures(
    vendor="GenuineIntel",
    flags=frozenset(
        _AVX512 | {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}
    ),
    machine="x86_64",
)

#: An AMD EPYC with AVX-512 VNNI and bf16 (Zen 4), no AMX.
AVX512_EPYC = CpuFeatures(
    vendor="AuthenticAMD",
    flags=frozenset(_AVX512 | {"avx512_vnni", "avx512_bf16"}),
    machine="x86_64",
)

#: An AMD EPYC with AVX2 only: no VNNI, no bf16.
AVX2_EPYC = CpuFeatures(
    vendor="AuthenticAMD",
    flags=frozenset({"avx2", "fma", "f16c"}),
    machine="x86_64",
)

#: An ARM server (Graviton-like).
ARM = CpuFeatures(
    vendor="",
    flags=frozenset({"asimd", "asimddp", "i8mm", "bf16"}),
    machine="aarch64",
)

SIMULATED = {"amx-xeon": AMX_XEON, "avx512-epyc": AVX512_EPYC, "avx2-epyc": AVX2_EPYC, "arm": ARM}
