"""The x86 instruction set the CPU kernels are built for, chosen once per process.

    avx512_bf16   AVX-512 F/BW/DQ/VL + AVX512-BF16: the VDPBF16PS GEMM (gemm_bf16.cpp) for bf16
    avx512        AVX-512 F/BW/DQ/VL: 512-bit widening GEMM for 16-bit weights (gemm_widen.cpp)
    avx2          AVX2 + FMA + F16C (every current x86-64): 256-bit widening GEMM
    baseline      none of those (or not x86): scalar loops the compiler vectorizes as it can

The CPU's own level comes from /proc/cpuinfo's flags. `ZSERVE_CPU_ISA=avx2|avx512|avx512_bf16|
baseline` forces a lower level on a higher CPU (so one machine tests every path); asking for a
level the CPU lacks is an error, because the build would issue instructions it cannot run.

Each level compiles with its own -march (x86-64-v3 is AVX2 + FMA + F16C + BMI; x86-64-v4 adds
AVX-512 F/BW/CD/DQ/VL), never -march=native: a build for avx2 on an AVX-512 machine must hold no
AVX-512 instruction. The level is part of the kernels' build key (cpu_kernels.py).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

ISA_ENV = "ZSERVE_CPU_ISA"
LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")  # lowest first
REQUIRED_FLAGS = {
    "baseline": (),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "avx512_bf16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"),
}
MARCH_FLAGS = {
    "baseline": ("-march=x86-64",),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512_bf16": ("-march=x86-64-v4", "-mavx512bf16"),
}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (empty where /proc/cpuinfo has none)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def highest_level(flags: frozenset[str]) -> str:
    """The highest level whose flags are all present."""
    return next(level for level in reversed(LEVELS) if all(flag in flags for flag in REQUIRED_FLAGS[level]))


def choose_level(flags: frozenset[str], forced: str | None, machine: str) -> str:
    """The level to build for: the CPU's highest, or `forced` when it is not higher."""
    if machine not in ("x86_64", "AMD64"):
        if forced not in (None, "", "baseline"):
            raise ValueError(f"{ISA_ENV}={forced}: this is a {machine} CPU, only baseline applies")
        return "baseline"
    best = highest_level(flags)
    if not forced:
        return best
    if forced not in LEVELS:
        raise ValueError(f"{ISA_ENV}={forced!r}: expected one of {', '.join(LEVELS)}")
    if LEVELS.index(forced) > LEVELS.index(best):
        missing = sorted(flag for flag in REQUIRED_FLAGS[forced] if flag not in flags)
        raise ValueError(f"{ISA_ENV}={forced}: this CPU lacks {', '.join(missing)} (its highest level is {best})")
    return forced


@functools.cache
def cpu_isa() -> str:
    """This process's level: the CPU's highest, or $ZSERVE_CPU_ISA (read once per process)."""
    return choose_level(cpu_flags(), os.environ.get(ISA_ENV), platform.machine())


def march_flags(level: str) -> tuple[str, ...]:
    """Compiler flags selecting `level`'s instructions (none off x86, where gcc's default applies)."""
    return MARCH_FLAGS[level] if platform.machine() in ("x86_64", "AMD64") else ()
