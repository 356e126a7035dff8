"""The feature set of the CPU kernels (model_proc/kernels/cpu_isa.py): the compile flags and the
int8 dot-product instruction of each set, and the kernels again at smaller sets this CPU can run,
forced with ZSERVE_CPU_ISA, in child pytest runs (one build each: about a minute).

The rules that choose a set are tests/common/test_isa_features.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zserve.model_proc.kernels.cpu_isa import IsaFeatures, cpu_flags, cpu_isa, int8_dot_instruction, march_flags

REPO = Path(__file__).resolve().parents[2]
# one set per int8 dot path (kernels/gemm_int8_dot.cpp): the smallest build that takes it, and whose CPUs have it
INT8_DOT_PATHS = {
    "vpdpbusd zmm": "avx512+avx512_vnni",  # Cascade Lake, Ice Lake; Zen 4, Sapphire Rapids with more
    "vpdpbusd ymm (avx-vnni)": "avx2+avx_vnni",  # Alder Lake
    "vpmaddubsw zmm": "avx512",  # Skylake-SP
    "vpmaddubsw ymm": "avx2",  # Zen 2/3, Haswell
}
# the sets the broad child run below tries, first that is smaller than this process's
LOWER_SETS = ("avx512+avx512_vnni", "avx512", "avx2", "baseline")


@pytest.mark.parametrize(
    "text, flags, instruction",
    [
        ("baseline", ("-march=x86-64",), ""),
        ("avx2", ("-march=x86-64-v3",), "vpmaddubsw ymm"),
        ("avx2+avx_vnni", ("-march=x86-64-v3", "-mavxvnni"), "vpdpbusd ymm (avx-vnni)"),
        ("avx512", ("-march=x86-64-v4",), "vpmaddubsw zmm"),
        ("avx512+avx_vnni", ("-march=x86-64-v4", "-mavxvnni"), "vpmaddubsw zmm"),  # zmm kernels: VEX VNNI unused
        ("avx512+avx512_vnni", ("-march=x86-64-v4", "-mavx512vnni"), "vpdpbusd zmm"),
        ("avx512_bf16", ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"), "vpdpbusd zmm"),
        ("avx512+avx512_bf16", ("-march=x86-64-v4", "-mavx512bf16"), "vpmaddubsw zmm"),
        ("avx512+avx512_vnni+avx_vnni+avx512_bf16", ("-march=x86-64-v4", "-mavx512vnni", "-mavxvnni", "-mavx512bf16"),
         "vpdpbusd zmm"),
        ("avx512+avx512_vnni+avx_vnni+avx512_bf16+amx_int8",
         ("-march=x86-64-v4", "-mavx512vnni", "-mavxvnni", "-mavx512bf16", "-mamx-tile", "-mamx-int8"),
         "tdpbsud (amx-int8) from 16 rows, vpdpbusd zmm below"),
        ("avx512+amx_int8", ("-march=x86-64-v4", "-mamx-tile", "-mamx-int8"), "tdpbsud (amx-int8) from 16 rows, vpmaddubsw zmm below"),
    ],
)
def test_compile_flags_and_int8_dot_instruction_of_each_set(monkeypatch, text, flags, instruction):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    isa = IsaFeatures.parse(text)
    assert march_flags(isa) == flags and not any("native" in flag for flag in flags)
    assert int8_dot_instruction(isa) == instruction


def test_where_the_os_refuses_amx_the_vector_instruction_is_named():
    isa = IsaFeatures.parse("avx512+avx512_vnni+amx_int8")
    assert int8_dot_instruction(isa, amx_granted=False) == "vpdpbusd zmm"


def test_off_x86_the_compiler_chooses(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert march_flags(IsaFeatures()) == ()


def test_each_int8_dot_path_has_its_set():
    assert {path: int8_dot_instruction(IsaFeatures.parse(text)) for path, text in INT8_DOT_PATHS.items()} == {
        path: path for path in INT8_DOT_PATHS
    }


def test_this_process_runs_a_subset_of_the_cpus_features():
    assert cpu_isa().issubset(IsaFeatures.of_cpu(cpu_flags()))


def runnable_smaller_sets(candidates) -> list[IsaFeatures]:
    """The candidates this process's set holds, less itself."""
    sets = [IsaFeatures.parse(text) for text in candidates]
    return [isa for isa in sets if isa.issubset(cpu_isa()) and isa != cpu_isa()]


def run_child_pytest(isa: IsaFeatures, tests: list[str], *selection: str, timeout_s: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests, *selection],
        cwd=REPO, env={**os.environ, "ZSERVE_CPU_ISA": isa.name}, capture_output=True, text=True, timeout=timeout_s,
    )
    assert proc.returncode == 0, f"ZSERVE_CPU_ISA={isa.name}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout
    return proc.stdout


OLD_LEVELS = ("avx512", "avx2", "baseline")


def old_levels_below(other_widths_only: bool = False) -> list[IsaFeatures]:
    """The old level names this process's set holds, less itself; `other_widths_only`: only those whose vector width
    differs from its own (for a kernel whose loops differ by width alone)."""
    sets = [IsaFeatures.parse(name) for name in OLD_LEVELS]
    return [isa for isa in sets if isa.issubset(cpu_isa()) and isa != cpu_isa()
            and not (other_widths_only and isa.vector_bits == cpu_isa().vector_bits)]


def rerun_at_old_levels(test_file: str, selection: str, other_widths_only: bool = False,
                        none_skipped: bool = False) -> None:
    """`test_file`'s tests matching `selection` again with ZSERVE_CPU_ISA at each of old_levels_below (a kernel build
    each, cached for the suite's other runs at that level); skips when there is none. Every child must pass, and
    with `none_skipped` skip nothing."""
    levels = old_levels_below(other_widths_only)
    if not levels:
        pytest.skip(f"no level below {cpu_isa().name}")
    for isa in levels:
        stdout = run_child_pytest(isa, [test_file], "-k", selection, timeout_s=1800)
        summary = stdout.strip().splitlines()[-1]
        assert not none_skipped or " skipped" not in summary, f"ZSERVE_CPU_ISA={isa.name}:\n{stdout[-2000:]}"


def next_lower_set() -> IsaFeatures | None:
    smaller = runnable_smaller_sets(LOWER_SETS)
    return smaller[0] if smaller else None


# at the lower set, the bf16 parity tests run on the kinds that reach a kernel no other kind reaches (a sliding
# window, soft-capping): the MoE, RoPE-scaling and Phi-3 kinds run the same kernels through other weights
LOWER_SET_SELECTION = (
    "not test_kernels_at_the_next_lower_set and not moe and not mixtral and not gemma3_mm and not phi"
    " and not yarn and not dynamic"
)


@pytest.mark.timeout(1800)  # builds the kernels for other sets in a child: past the suite's 600 s when loaded
def test_kernels_at_the_next_lower_set():
    """The GEMM (16-bit and int8), attention, fused-op and bf16 parity tests again with ZSERVE_CPU_ISA at the first of
    LOWER_SETS below this process's set (a separate build: about a minute): an AVX512-BF16 machine runs Cascade Lake's
    set (bf16 through the widening GEMM, int8 by VPDPBUSD without AVX512-BF16 in the build), a Cascade Lake the
    avx512 one, an AVX-512 or AVX-VNNI machine the avx2 one, an AVX2 machine the baseline one (scalar kernels, bf16
    linear layers through torch.mm)."""
    lower = next_lower_set()
    if lower is None:
        pytest.skip(f"no set in {', '.join(LOWER_SETS)} below this process's ({cpu_isa().name})")
    tests = [
        "tests/model/test_gemm.py", "tests/model/test_gemm_int8.py", "tests/model/test_gemm_int8_dot.py", "tests/model/test_cpu_probe.py",
        "tests/model/test_gguf_blocks.py",
        "tests/model/test_attention_kernel.py", "tests/model/test_fused_ops.py", "tests/model/test_model_parity_bf16.py",
    ]
    run_child_pytest(lower, tests, "-k", LOWER_SET_SELECTION, timeout_s=1800)


def int8_dot_sets() -> list[IsaFeatures]:
    """The INT8_DOT_PATHS sets this process's holds whose path neither it nor the next lower set takes."""
    lower = next_lower_set()
    covered = {int8_dot_instruction(cpu_isa()), *([int8_dot_instruction(lower)] if lower is not None else [])}
    return [isa for isa in runnable_smaller_sets(INT8_DOT_PATHS.values()) if int8_dot_instruction(isa) not in covered]


@pytest.mark.timeout(1800)  # builds the kernels for other sets in a child: past the suite's 600 s when loaded
def test_int8_dot_kernel_on_every_path_this_cpu_runs():
    """The int8 x int8 GEMM (and its 4-bit path) has four forms (INT8_DOT_PATHS); this process and the run above
    reach one each, so every other one this CPU can run gets its tests alone in one more build (a Sapphire Rapids:
    AVX-VNNI ymm at avx2+avx_vnni, VPMADDUBSW zmm at avx512 and ymm at avx2). test_gemm_int8_dot.py checks there
    that the build reports the path's instruction; the stacked MoE experts (moe_experts.cpp over that GEMM) run
    their parity test there too."""
    others = int8_dot_sets()
    if not others:
        pytest.skip(f"this CPU runs no other int8 dot path below {cpu_isa().name}")
    for isa in others:
        files = ["tests/model/test_gemm_int8_dot.py", "tests/model/test_gguf_blocks.py", "tests/model/test_six_bit_codes.py",
                 "tests/model/test_gguf_pack.py",  # 6-bit codes and compact scales, decoded by each path
                 "tests/model/test_gguf_moe.py::test_stacked_experts_match_the_loop"]
        stdout = run_child_pytest(isa, files, timeout_s=900)
        assert " skipped" not in stdout, f"ZSERVE_CPU_ISA={isa.name}:\n{stdout[-2000:]}"


@pytest.mark.parametrize("text", ["avx512+avx512_vnni", "avx2+avx_vnni"])
def test_the_vnni_sets_are_forced_where_the_cpu_has_them(text):
    """Cascade Lake's and Alder Lake's sets, VPDPBUSD without AVX512-BF16 in the build and VEX-encoded: a CPU with
    their flags runs their kernels in this process or in one of the child runs above."""
    isa = IsaFeatures.parse(text)
    if not isa.issubset(cpu_isa()):
        pytest.skip(f"this process's set ({cpu_isa().name}) does not hold {text}")
    assert isa in [cpu_isa(), next_lower_set(), *int8_dot_sets()]
