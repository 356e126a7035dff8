"""What machine and code a figure came from: CPU, cores, memory, load, versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from zserve.model_proc.kernels.cpu_isa import cpu_flags, cpu_isa


def machine_info() -> dict:
    return {
        "cpu": _cpu_model(),
        "cpu_family_model": _cpu_field("cpu family") + "/" + _cpu_field("model"),
        "cpu_isa": _cpu_isa(),
        "cpu_simd_flags": sorted(flag for flag in cpu_flags() if flag.startswith(("avx", "fma", "f16c", "amx"))),
        "num_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_gib": _mem_gib(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "git_commit": _git_commit(),
    }


def _cpu_field(name: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _cpu_isa() -> str:
    """The kernels' feature set in this process (everything the CPU has, or $ZSERVE_CPU_ISA's)."""
    try:
        return cpu_isa().name
    except ValueError as exc:  # a $ZSERVE_CPU_ISA this CPU cannot run: the figure says so
        return f"invalid: {exc}"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
