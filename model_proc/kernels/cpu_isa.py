"""The x86 instruction set the CPU kernels are built for, chosen once per process.

The levels and the rules that pick one are common/cpu_isa_level.py's (torch-free: the launcher
checks `--cpu-isa` with them and resolves it once). A server's model worker starts with the
resolved level in $ZSERVE_CPU_ISA (common/worker_env.py, from the config), like its OpenMP
settings: the kernels are one extension per process, loaded once. A process that runs the
kernels without a server (tests, benchmarks) gets the CPU's highest level, or $ZSERVE_CPU_ISA's.

Each level compiles with its own -march (x86-64-v3 is AVX2 + FMA + F16C + BMI; x86-64-v4 adds
AVX-512 F/BW/CD/DQ/VL), never -march=native: a build for avx2 on an AVX-512 machine must hold no
AVX-512 instruction. The level is part of the kernels' build key (cpu_kernels.py).
"""

from __future__ import annotations

import functools
import os
import platform

from zserve.common.cpu_isa_level import (
    CPU_ISA_ENV,
    LEVELS,
    REQUIRED_FLAGS,
    choose_level,
    cpu_flags,
    highest_level,
)

__all__ = [
    "LEVELS", "MARCH_FLAGS", "REQUIRED_FLAGS", "choose_level", "cpu_flags", "cpu_isa", "highest_level", "march_flags",
]
ISA_ENV = CPU_ISA_ENV  # the worker's level, set by the launcher from --cpu-isa (worker_env)
MARCH_FLAGS = {
    "baseline": ("-march=x86-64",),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512_bf16": ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
}


@functools.cache
def cpu_isa() -> str:
    """This process's level: the CPU's highest, or $ZSERVE_CPU_ISA (read once per process)."""
    return choose_level(cpu_flags(), os.environ.get(ISA_ENV), platform.machine(), what=f"${ISA_ENV}")


def march_flags(level: str) -> tuple[str, ...]:
    """Compiler flags selecting `level`'s instructions (none off x86, where gcc's default applies)."""
    return MARCH_FLAGS[level] if platform.machine() in ("x86_64", "AMD64") else ()
