"""What this CPU can compute, read once from the operating system.

Every hardware-dependent decision of the library reads this one function: which provider
``auto`` prefers, and what an int8 model's numbers depend on (ONNX Runtime's int8 kernels
differ between AVX2, AVX-512 VNNI and AMX, and an int8 plan judged on one is no proof on
another, so the kernels' instruction sets are part of the cache key). Tests simulate
another CPU by replacing :func:`cpu_features`' answer.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

#: Instruction sets with a dot product of 8-bit integers that accumulates without
#: saturating (AVX-512 VNNI, AVX-VNNI, AMX).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})

#: The instruction sets that select ONNX Runtime's int8 kernels (MLAS): AVX2's u8s8 path
#: can saturate where the VNNI and AMX ones do not.
INT8_KERNEL_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"}
)


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``, "" if unknown) and its
    feature flags as Linux names them (``avx512_bf16``, ``amx_int8``, ...)."""

    vendor: str
    flags: frozenset[str]
    #: ``platform.machine()``: ``x86_64``, ``aarch64``, ...
    machine: str = ""

    @property
    def int8_products_saturate(self) -> bool:
        """Whether ONNX Runtime's x86 int8 kernels multiply u8 by s8 with ``vpmaddubsw``,
        whose 16-bit sums saturate: an x86 CPU without VNNI. ONNX Runtime's quantization
        documentation recommends 7-bit weights (``reduce_range``) there."""
        x86 = self.machine.lower() in ("x86_64", "amd64", "i386", "i686")
        return x86 and not self.flags & VNNI_FLAGS

    @property
    def int8_kernels(self) -> tuple[str, ...]:
        """The flags that decide which int8 kernels ONNX Runtime runs, sorted."""
        return tuple(sorted(self.flags & INT8_KERNEL_FLAGS))


def _read_cpuinfo() -> CpuFeatures:
    vendor, flags = "", frozenset[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf8") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif name == "flags" and not flags:
                    flags = frozenset(value.split())
                if vendor and flags:
                    break
    except OSError:  # not Linux: nothing known, every hardware decision takes its safe side
        pass
    return CpuFeatures(vendor=vendor, flags=flags, machine=platform.machine())


@functools.cache
def cpu_features() -> CpuFeatures:
    """This CPU's features (read once per process)."""
    return _read_cpuinfo()
