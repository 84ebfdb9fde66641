"""What this CPU can compute: the one place every hardware-dependent decision reads.

The library decides several things by the CPU it runs on:

- which provider ``auto`` prefers (the vendor: each backend's ``auto_rank``);
- whether bf16 runs on bf16 units;
- whether int8 dot products accumulate without saturating (VNNI, AMX), and which int8
  kernels a runtime runs (part of the cache key).

All of them read :func:`cpu_features`, so a test can put another CPU in its place with
:func:`simulated` and check what the library would do there. What a runtime makes of
these features (which kernels a runtime compiles, what its plugin reports) is the rule of
that runtime's backend, which reads them from here; this module knows no runtime.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

#: Instruction sets with a dot product of 8-bit integers that accumulates without
#: saturating (AVX-512 VNNI, AVX-VNNI, AMX).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})

#: The AVX-512 subsets oneDNN's ``avx512_core`` needs (its VNNI and bf16 levels build on it).
AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})

#: The instruction sets an x86 int8 kernel is chosen by: AVX2's u8 x s8 product can
#: saturate where the VNNI and AMX ones do not.
INT8_KERNEL_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"}
)

#: The instruction sets with bf16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``, "" if unknown), its feature
    flags as Linux names them (``avx512_bf16``, ``amx_int8``, ...) and
    ``platform.machine()``."""

    vendor: str
    flags: frozenset[str]
    machine: str = ""

    @property
    def x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i386", "i686")

    @property
    def vnni(self) -> bool:
        """An int8 dot product that oneDNN uses: AVX-VNNI, or AVX-512 VNNI on AVX-512 core."""
        return "avx_vnni" in self.flags or (
            "avx512_vnni" in self.flags and AVX512_CORE <= self.flags
        )

    @property
    def amx(self) -> bool:
        return {"amx_tile", "amx_int8"} <= self.flags

    @property
    def bf16(self) -> bool:
        """Whether the CPU has bf16 arithmetic units (AVX512_BF16 or AMX-BF16)."""
        return self.x86 and bool(self.flags & BF16_FLAGS)

    @property
    def int8_products_saturate(self) -> bool:
        """Whether an int8 product here is u8 by s8 with ``vpmaddubsw``, whose 16-bit sums
        saturate: an x86 CPU without VNNI (what a runtime does about it, such as 7-bit
        weights, is its backend's rule)."""
        return self.x86 and not self.flags & VNNI_FLAGS

    @property
    def int8_kernels(self) -> tuple[str, ...]:
        """The flags an x86 int8 kernel is chosen by, sorted (a runtime's cache key)."""
        return tuple(sorted(self.flags & INT8_KERNEL_FLAGS))

    def without_bf16(self) -> CpuFeatures:
        """This CPU as one without bf16 units (an Intel Cascade Lake or Ice Lake: VNNI but
        no bf16), for benchmarks and tests of what the library does there."""
        return replace(self, flags=self.flags - BF16_FLAGS)

    def describe(self) -> str:
        """One line for people: what int8 and bf16 run on here."""
        int8 = "AMX" if self.amx else "VNNI" if self.vnni else "no VNNI (saturating u8 x s8)"
        bf16 = "bf16 units" if self.bf16 else "no bf16 units"
        return f"{self.vendor or 'unknown vendor'} {self.machine}: int8 on {int8}, {bf16}"


def _read_cpuinfo() -> tuple[str, frozenset[str]]:
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
    return vendor, flags


@functools.cache
def _detected() -> CpuFeatures:
    vendor, flags = _read_cpuinfo()
    return CpuFeatures(vendor=vendor, flags=flags, machine=platform.machine())


_simulated: list[CpuFeatures] = []


def cpu_features() -> CpuFeatures:
    """This CPU's features (read once per process), or the one :func:`simulated` puts in
    its place."""
    return _simulated[-1] if _simulated else _detected()


def is_this_cpu(features: CpuFeatures) -> bool:
    """Whether ``features`` are this machine's own (not a simulated CPU): only then may a
    runtime be asked what it can do here."""
    return features == _detected()


@contextmanager
def simulated(features: CpuFeatures) -> Iterator[CpuFeatures]:
    """Make every hardware decision of the library as it would be on ``features``'s CPU."""
    _simulated.append(features)
    try:
        yield features
    finally:
        _simulated.remove(features)
