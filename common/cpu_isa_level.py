"""Which x86 instruction-set level the CPU kernels may use: the rules, torch-free, so the launcher
checks `--cpu-isa` before it starts anything (model_proc/kernels/cpu_isa.py builds for the level).

    avx512_bf16   AVX-512 F/BW/DQ/VL + AVX512-BF16 + AVX512-VNNI: the VDPBF16PS GEMM (gemm_bf16.cpp)
                  for bf16, VPDPBUSD for int8 weights times int8 activations (gemm_int8_dot.cpp);
                  every CPU with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4/5) has VNNI
    avx512        AVX-512 F/BW/DQ/VL: 512-bit widening GEMM for 16-bit weights (gemm_widen.cpp)
    avx2          AVX2 + FMA + F16C (every current x86-64): 256-bit widening GEMM
    baseline      none of those (or not x86): scalar loops the compiler vectorizes as it can

The CPU's own level comes from /proc/cpuinfo's flags. A lower level may be forced on a higher CPU
(so one machine tests every path); a level the CPU lacks is an error, because the build would
issue instructions it cannot run.
"""

from __future__ import annotations

import platform
from pathlib import Path

# the default of --cpu-isa; and how the launcher hands the resolved level to the model worker
CPU_ISA_ENV = "ZSERVE_CPU_ISA"
LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")  # lowest first
REQUIRED_FLAGS = {
    "baseline": (),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "avx512_bf16": (
        "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni",
    ),
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


def choose_level(flags: frozenset[str], forced: str | None, machine: str, what: str = "--cpu-isa") -> str:
    """The level to build for: the CPU's highest, or `forced` when it is not higher ("auto", ""
    and None force nothing). `what` names the setting in errors."""
    forced = None if forced in (None, "", "auto") else forced
    if machine not in ("x86_64", "AMD64"):
        if forced not in (None, "baseline"):
            raise ValueError(f"{what} {forced}: this is a {machine} CPU, only baseline applies")
        return "baseline"
    best = highest_level(flags)
    if forced is None:
        return best
    if forced not in LEVELS:
        raise ValueError(f"{what} {forced!r}: expected one of {', '.join(LEVELS)}")
    if LEVELS.index(forced) > LEVELS.index(best):
        missing = sorted(flag for flag in REQUIRED_FLAGS[forced] if flag not in flags)
        raise ValueError(f"{what} {forced}: this CPU lacks {', '.join(missing)} (its highest level is {best})")
    return forced


def resolve_cpu_isa(choice: str) -> str:
    """`--cpu-isa` on this machine: "auto" becomes the CPU's highest level; a level it lacks is refused."""
    return choose_level(cpu_flags(), choice, platform.machine())
