"""The instruction-set level of the CPU kernels (model_proc/kernels/cpu_isa.py), and the kernels
at a level below this CPU's, forced with ZSERVE_CPU_ISA, in a child pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zserve.model_proc.kernels.cpu_isa import (
    LEVELS,
    MARCH_FLAGS,
    choose_level,
    cpu_flags,
    cpu_isa,
    highest_level,
)

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})  # a Zen 3
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
AVX512_BF16 = AVX512 | {"avx512_bf16", "avx512_vnni"}
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "flags, level",
    [(frozenset({"sse2"}), "baseline"), (frozenset({"avx2", "fma"}), "baseline"), (AVX2, "avx2"), (AVX512, "avx512"), (AVX512_BF16, "avx512_bf16")],
)
def test_highest_level_from_flags(flags, level):
    assert highest_level(flags) == level


def test_forcing_a_lower_level_and_refusing_a_higher_one():
    assert choose_level(AVX512_BF16, "avx2", "x86_64") == "avx2"
    assert choose_level(AVX512_BF16, None, "x86_64") == "avx512_bf16"
    assert choose_level(AVX2, "", "x86_64") == "avx2"
    with pytest.raises(ValueError, match="lacks avx512_bf16, avx512_vnni, avx512bw, avx512dq, avx512f, avx512vl"):
        choose_level(AVX2, "avx512_bf16", "x86_64")
    with pytest.raises(ValueError, match="expected one of baseline, avx2, avx512, avx512_bf16"):
        choose_level(AVX2, "sse9", "x86_64")
    assert choose_level(frozenset(), None, "aarch64") == "baseline"
    with pytest.raises(ValueError, match="aarch64"):
        choose_level(frozenset(), "avx2", "aarch64")


def test_each_level_has_its_own_march():
    assert len({MARCH_FLAGS[level] for level in LEVELS}) == len(LEVELS)
    assert all("native" not in flag for flags in MARCH_FLAGS.values() for flag in flags)


def test_this_process_runs_at_most_the_cpus_level():
    assert LEVELS.index(cpu_isa()) <= LEVELS.index(highest_level(cpu_flags()))


# at the lower level, the bf16 parity tests run on the kinds that reach a kernel no other kind reaches (a sliding
# window, soft-capping): the MoE, RoPE-scaling and Phi-3 kinds run the same kernels through other weights
LOWER_LEVEL_SELECTION = (
    "not test_kernels_at_the_next_lower_level and not moe and not mixtral and not gemma3_mm and not phi"
    " and not yarn and not dynamic"
)


def test_kernels_at_the_next_lower_level():
    """The GEMM (16-bit and int8), attention, fused-op and bf16 parity tests again with ZSERVE_CPU_ISA one level below
    this process's (a separate build: about a minute): an AVX-512 machine runs the AVX2 path, an
    AVX2 machine the baseline one (scalar kernels, bf16 linear layers through torch.mm)."""
    level = cpu_isa()
    if level == "baseline":
        pytest.skip("this process runs the lowest level already")
    lower = LEVELS[LEVELS.index(level) - 1]
    env = {**os.environ, "ZSERVE_CPU_ISA": lower}
    tests = [
        "tests/model/test_gemm.py", "tests/model/test_gemm_int8.py", "tests/model/test_gemm_int8_dot.py", "tests/model/test_cpu_probe.py",
        "tests/model/test_gguf_blocks.py",
        "tests/model/test_attention_kernel.py", "tests/model/test_fused_ops.py", "tests/model/test_model_parity_bf16.py",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests, "-k", LOWER_LEVEL_SELECTION],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, f"ZSERVE_CPU_ISA={lower}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout


def test_int8_dot_kernel_at_the_levels_further_down():
    """The int8 x int8 GEMM (and its 4-bit path) has three forms (VPDPBUSD at avx512_bf16,
    VPMADDUBSW on zmm at avx512 and on ymm at avx2); the test above reaches the next lower level
    only, so an AVX512-VNNI machine also runs their tests at avx2 (one more build)."""
    level = cpu_isa()
    further = [lower for lower in LEVELS[1 : max(1, LEVELS.index(level) - 1)]]  # avx2 .. two below, not baseline
    if not further:
        pytest.skip(f"no level with the kernel two or more below {level}")
    for lower in further:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/model/test_gemm_int8_dot.py",
             "tests/model/test_gguf_blocks.py"],
            cwd=REPO, env={**os.environ, "ZSERVE_CPU_ISA": lower}, capture_output=True, text=True, timeout=900,
        )
        assert proc.returncode == 0, f"ZSERVE_CPU_ISA={lower}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
        assert " passed" in proc.stdout and " skipped" not in proc.stdout
