"""kernels/cpu_probe.cpp, the rates benchmarks/bench_model.py compares its GEMMs with: each
instruction the build has gives a positive rate, one it lacks 0, and the clock is a clock."""

from __future__ import annotations

import pytest
import torch

from zserve.model_proc.kernels.cpu_isa import IsaFeatures, cpu_isa, int8_dot_instruction
from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels

pytestmark = pytest.mark.skipif(not load_cpu_kernels(), reason="the CPU kernels are not built here")


def probed_instructions(isa: IsaFeatures) -> set[str]:
    """What a build for `isa` measures: FMA and VPMADDUBSW at its width, VDPBF16PS with avx512_bf16, and VPDPBUSD
    where the int8 dot products use it (zmm with avx512_vnni, ymm with avx_vnni in a 256-bit build)."""
    if isa.vector_bits == 0:
        return set()
    return {"fma", "vpmaddubsw"} | ({"vdpbf16ps"} if "avx512_bf16" in isa else set()) | (
        {"vpdpbusd"} if "vpdpbusd" in int8_dot_instruction(isa) else set()
    )


def test_what_each_set_measures():
    assert probed_instructions(IsaFeatures.parse("avx2")) == {"fma", "vpmaddubsw"}
    assert probed_instructions(IsaFeatures.parse("avx2+avx_vnni")) == {"fma", "vpmaddubsw", "vpdpbusd"}
    assert probed_instructions(IsaFeatures.parse("avx512+avx_vnni")) == {"fma", "vpmaddubsw"}
    assert probed_instructions(IsaFeatures.parse("avx512+avx512_vnni")) == {"fma", "vpmaddubsw", "vpdpbusd"}
    assert probed_instructions(IsaFeatures.parse("avx512+avx512_bf16")) == {"fma", "vpmaddubsw", "vdpbf16ps"}


def best_of_three(what: str, iterations: int) -> float:
    """The highest of three probes: a thread descheduled during one (a loaded machine) lowers only that one."""
    return max(torch.ops.zserve.probe_rate(what, iterations) for _ in range(3))


def test_clock_is_plausible():
    hz = best_of_three("clock", 1_000_000)
    assert 5e7 < hz < 1e10, hz  # 16 dependent adds a loop: not below 50 MHz, not above 10 GHz


@pytest.mark.parametrize("what", ["fma", "vdpbf16ps", "vpdpbusd", "vpmaddubsw"])
def test_each_instruction_the_build_has_has_a_rate(what):
    rate = best_of_three(what, 20_000)
    assert (rate > 1e7) if what in probed_instructions(cpu_isa()) else rate == 0.0, (what, rate)


def test_bad_probe_is_refused():
    with pytest.raises(RuntimeError, match="expected clock, fma, vdpbf16ps, vpdpbusd or vpmaddubsw"):
        torch.ops.zserve.probe_rate("amx", 10)
    with pytest.raises(RuntimeError, match="iterations must be positive"):
        torch.ops.zserve.probe_rate("fma", 0)
