"""kernels/cpu_probe.cpp, the rates benchmarks/bench_model.py compares its GEMMs with: each
instruction the build has gives a positive rate, one it lacks 0, and the clock is a clock."""

from __future__ import annotations

import pytest
import torch

from zserve.model_proc.kernels.cpu_isa import cpu_isa
from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels

pytestmark = pytest.mark.skipif(not load_cpu_kernels(), reason="the CPU kernels are not built here")
HAS = {  # what each level's build holds
    "baseline": set(),
    "avx2": {"fma", "vpmaddubsw"},
    "avx512": {"fma", "vpmaddubsw"},
    "avx512_bf16": {"fma", "vpmaddubsw", "vdpbf16ps", "vpdpbusd"},
}


def test_clock_is_plausible():
    hz = torch.ops.zserve.probe_rate("clock", 200_000)
    assert 2e8 < hz < 1e10, hz


@pytest.mark.parametrize("what", ["fma", "vdpbf16ps", "vpdpbusd", "vpmaddubsw"])
def test_each_instruction_the_build_has_has_a_rate(what):
    rate = torch.ops.zserve.probe_rate(what, 20_000)
    assert (rate > 1e8) if what in HAS[cpu_isa()] else rate == 0.0, (what, rate)


def test_bad_probe_is_refused():
    with pytest.raises(RuntimeError, match="expected clock, fma, vdpbf16ps, vpdpbusd or vpmaddubsw"):
        torch.ops.zserve.probe_rate("amx", 10)
    with pytest.raises(RuntimeError, match="iterations must be positive"):
        torch.ops.zserve.probe_rate("fma", 0)
