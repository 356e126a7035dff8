"""The int8 x int8 GEMM's rows in AMX tiles (kernels/gemm_amx.cpp, feature amx_int8): from
AMX_MIN_ROWS rows, whole tiles of 16 rows go through TDPBSUD, the rest through the vector path
(VPDPBUSD or VPMADDUBSW). Every row's result must equal, bit for bit, what the vector path gives that
row alone (one row never reaches AMX): the same exact int32 sums per sub-block of min(G, 32) k and the
same fp32 rescale in the same order. Int8 codes, nibbles and 6-bit codes (expanded to int8 quads),
fp32 and compact scales (an implied offset too), offsets or none, G = 16, 32, 64 and K, column pieces, a bias, N off the blocks of 16.

Where the CPU (or this process's set, or the OS) has no AMX, the AMX tests skip with the reason; the
child run at the next lower set (no amx_int8) checks there that the build says so and that no AMX
runs, and a child refused the tiles by the OS (a signal stack too small for their frame) that it falls
back to the vector path, logs it once, and gives the same bits."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import torch

from testing.random_dot_weights import random_dot_weight, side_by_side
from tests.model.test_cpu_isa import REPO, next_lower_set, run_child_pytest
from tests.model.test_gemm_int8_dot import needs_kernel, random_rows
from zserve.model_proc.kernels.cpu_isa import AMX_MIN_ROWS, BF16_TILE_MIN_ROWS, cpu_isa, int8_dot_instruction
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.int8_kernels import gemm_int8_dot

# bf16 x of BF16_TILE_MIN_ROWS rows and more goes through bf16 tiles where the CPU has AMX-BF16 (test_bf16_tiles.py)
ROWS = [1, 15, 16, 17, 33, BF16_TILE_MIN_ROWS - 1]
K, N = 256, 40  # N off the blocks of 16


def amx_granted() -> bool:
    return load_gemm_int8_dot() is not None and torch.ops.zserve.gemm_int8_dot_amx_granted()


NO_AMX = (
    f"no AMX tiles in this process (set {cpu_isa()}: AMX needs amx_int8, the CPU's amx_tile and amx_int8 flags, "
    "and the OS's permission)"
)
needs_amx = pytest.mark.skipif(not amx_granted(), reason=NO_AMX)


def row_by_row(x: torch.Tensor, packed, with_bias: bool) -> torch.Tensor:
    """The vector path's result: one row at a time never reaches AMX."""
    bias = torch.zeros(1) if with_bias else None
    return torch.cat([gemm_int8_dot(x[i : i + 1], packed, bias) for i in range(x.shape[0])])


def assert_bit_identical(x: torch.Tensor, packed, with_bias: bool, what) -> None:
    bias = torch.zeros(1) if with_bias else None  # gemm_int8_dot adds packed.bias when a bias is passed
    y, ref = gemm_int8_dot(x, packed, bias), row_by_row(x, packed, with_bias)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], packed.out_features)
    assert torch.equal(y.view(torch.int16 if y.element_size() == 2 else torch.int32),
                       ref.view(torch.int16 if ref.element_size() == 2 else torch.int32)), (what, float((y - ref).abs().max()))


@needs_kernel
def test_the_build_says_whether_amx_multiplies():
    granted = torch.ops.zserve.gemm_int8_dot_amx_granted()
    assert torch.ops.zserve.gemm_int8_dot_instruction() == int8_dot_instruction(cpu_isa(), amx_granted=granted)
    if "amx_int8" not in cpu_isa():
        assert not granted and "tdpbsud" not in torch.ops.zserve.gemm_int8_dot_instruction()


@needs_amx
def test_amx_is_named_with_its_threshold():
    assert torch.ops.zserve.gemm_int8_dot_instruction().startswith(f"tdpbsud (amx-int8) from {AMX_MIN_ROWS} rows, ")


@needs_amx
@pytest.mark.parametrize("bits", [8, 4, 6])
@pytest.mark.parametrize("compact", [False, True], ids=["fp32_scales", "compact_scales"])
@pytest.mark.parametrize("offsets", [False, True], ids=["no_offsets", "offsets"])
@pytest.mark.parametrize("group_size", [16, 32, 64, K])
def test_amx_rows_equal_the_vector_path_bit_for_bit(bits, compact, offsets, group_size):
    if bits == 6 and not compact:
        pytest.skip("6-bit codes come with compact scales only (Q6_K's, gemm_dot_compact)")
    packed = random_dot_weight(K, N, bits=bits, group_size=group_size, compact=compact, offsets=offsets, bias=True,
                               seed=bits + 7 * group_size + 3 * compact + offsets)
    for rows in ROWS:
        for dtype in (torch.bfloat16, torch.float32):
            x = random_rows(rows, K, seed=rows).to(dtype)
            assert_bit_identical(x, packed, with_bias=rows % 2 == 1, what=(rows, dtype))


@needs_amx
@pytest.mark.parametrize("bits", [8, 4, 6])
def test_amx_rows_with_an_implied_offset_equal_the_vector_path(bits):
    """One group per super and no stored factors (Q4_0: S = d, O = -8 d; Q8_0: no offset)."""
    for implied in (-8, 1):
        packed = random_dot_weight(K, N, bits=bits, group_size=32, compact=True, offsets=False, bias=True, seed=bits,
                                   implied_offset=implied)
        for rows in ROWS:
            assert_bit_identical(random_rows(rows, K, seed=rows).bfloat16(), packed, with_bias=True, what=(implied, rows))


@needs_amx
def test_amx_rows_of_column_pieces_equal_the_vector_path():
    """Q4_K_M's attention: 4-bit pieces with compact scales and offsets beside an int8 piece in groups of 16."""
    pieces = side_by_side(
        random_dot_weight(K, 32, bits=4, group_size=32, compact=True, offsets=True, bias=False, seed=1),
        random_dot_weight(K, 16, bits=4, group_size=32, compact=True, offsets=True, bias=False, seed=2),
        random_dot_weight(K, 24, bits=8, group_size=16, compact=True, offsets=False, bias=False, seed=3),
    )
    for rows in ROWS:
        assert_bit_identical(random_rows(rows, K, seed=rows).bfloat16(), pieces, with_bias=False, what=rows)


@needs_amx
def test_amx_extreme_codes_and_long_k():
    """Codes at both ends (0 and 255 stored) against xq at +-127 over K = 2048: exact int32 sums."""
    packed = random_dot_weight(2048, 48, bits=8, group_size=32, compact=False, offsets=True, bias=False, seed=5)
    packed.values[..., ::2] = 0
    packed.values[..., 1::2] = 255
    x = torch.where(torch.rand(32, 2048, generator=torch.Generator().manual_seed(0)) < 0.5, -1.0, 1.0)
    assert_bit_identical(x, packed, with_bias=False, what="extremes")


def test_without_amx_at_the_next_lower_set():
    """This file again with ZSERVE_CPU_ISA at the next lower set (test_cpu_isa.py's, built there too), which has
    no amx_int8: the build names the vector path, and the AMX tests skip."""
    lower = next_lower_set()
    if "amx_int8" not in cpu_isa() or lower is None:
        pytest.skip(f"this process's set ({cpu_isa()}) has no amx_int8 to leave out")
    assert "amx_int8" not in lower
    stdout = run_child_pytest(lower, ["tests/model/test_gemm_amx.py"], "-k", "not next_lower_set", "-rs", timeout_s=900)
    assert "no AMX tiles in this process" in stdout


REFUSED_CHILD = """
import ctypes, hashlib, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(message)s")
libc = ctypes.CDLL(None, use_errno=True)
class stack_t(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]
signal_stack = ctypes.create_string_buffer(8192)  # room for an AVX-512 signal frame, not for the AMX one
assert libc.sigaltstack(ctypes.byref(stack_t(ctypes.cast(signal_stack, ctypes.c_void_p), 0, 8192)), None) == 0
import torch
from testing.random_dot_weights import random_dot_weight
from tests.model.test_gemm_int8_dot import random_rows
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.int8_kernels import gemm_int8_dot
assert load_gemm_int8_dot() is not None and load_gemm_int8_dot() is not None
packed = random_dot_weight(256, 40, bits=4, group_size=32, compact=True, offsets=True, bias=True, seed=11)
y = gemm_int8_dot(random_rows(48, 256, seed=3).bfloat16(), packed, torch.zeros(1))
print("GRANTED", torch.ops.zserve.gemm_int8_dot_amx_granted(), torch.ops.zserve.gemm_int8_dot_instruction())
print("OUTPUT", hashlib.sha256(y.view(torch.int16).numpy().tobytes()).hexdigest())
"""


@needs_amx
def test_a_refused_process_falls_back_to_the_vector_path_and_says_so_once():
    """A process with a thread whose signal stack cannot hold the AMX signal frame is refused the tiles
    (arch_prctl ARCH_REQ_XCOMP_PERM: ENOSPC): it multiplies by the vector path, logs the refusal once, and
    its outputs equal this process's AMX outputs bit for bit."""
    proc = subprocess.run([sys.executable, "-c", REFUSED_CHILD], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    vector = int8_dot_instruction(cpu_isa(), amx_granted=False)
    assert f"GRANTED False {vector}" in lines
    refusals = [line for line in lines if line.startswith("LOG ") and "refused this process the AMX tile data" in line]
    assert len(refusals) == 1, proc.stdout
    packed = random_dot_weight(256, 40, bits=4, group_size=32, compact=True, offsets=True, bias=True, seed=11)
    y = gemm_int8_dot(random_rows(48, 256, seed=3).bfloat16(), packed, torch.zeros(1))
    assert f"OUTPUT {hashlib.sha256(y.view(torch.int16).numpy().tobytes()).hexdigest()}" in lines
