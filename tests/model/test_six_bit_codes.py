"""GGUF Q6_K kept as 6-bit codes (kernels/six_bit_codes.h, weights/six_bit_codes.py): the
torch packing round-trips; gguf_pack's Q6_K rows decode to gguf's own dequantization bit for bit, as a
matrix and as embedding rows (PackedBlocks.columns); the header's expansion to int8 quads
(zserve::six_bit_quads, what an AMX tile fill calls) equals the torch packing; and gemm_dot_compact on
6-bit codes equals it on the same codes as int8 quads (today's Q6_K path) bit for bit, for every row
count, dtype and bias, since both sum the same exact int32 products. tests/model/test_cpu_isa.py runs
this file again at each int8 dot path this CPU has (VPDPBUSD zmm / ymm, VPMADDUBSW zmm / ymm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.gguf_random_blocks import random_blocks
from tests.model.test_gemm_int8_dot import needs_kernel, random_rows
from zserve.model_proc.kernels.cpu_kernels import load_gguf_pack
from zserve.model_proc.weights.column_blocks import pack_column_blocks, pack_int8_quads, padded_bias
from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks
from zserve.model_proc.weights.six_bit_codes import pack_six_bit, six_bit_codes

needs_pack = pytest.mark.skipif(load_gguf_pack() is None, reason="the CPU kernels are not built here")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ROWS = [1, 2, 3, 5, 8, 9, 17, 40]


def random_codes(k: int, n: int, seed: int) -> torch.Tensor:
    """int8 [K, N] over Q6_K's whole range [-32, 31], its ends included."""
    codes = torch.randint(-32, 32, (k, n), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)
    codes[0, 0], codes[-1, -1] = -32, 31
    return codes


@pytest.mark.parametrize(("k", "n"), [(16, 16), (64, 37), (256, 5), (512, 48)])
def test_packing_round_trips(k, n):
    codes = random_codes(k, n, seed=k + n)
    packed = pack_six_bit(codes)
    assert packed.shape == (-(-n // 16), 3 * k // 16, 16, 4) and packed.dtype == torch.uint8
    per_column = six_bit_codes(packed.permute(0, 2, 1, 3))  # [NB, 16, K]
    assert torch.equal(per_column.permute(2, 0, 1).reshape(k, -1)[:, :n], codes.to(torch.int16))
    assert (per_column.permute(2, 0, 1).reshape(k, -1)[:, n:] == 0).all()  # past N: code 0


def q6_k(rows: int, cols: int, seed: int, magnitude: float | None = 0.05) -> tuple[np.ndarray, PackedBlocks]:
    raw = random_blocks("Q6_K", rows, cols, seed=seed, magnitude=magnitude)
    values, *parts, bits, group, implied = torch.ops.zserve.gguf_pack(torch.from_numpy(raw), "Q6_K", torch.arange(rows), cols)
    return raw, PackedBlocks(values, CompactScales(*(p if p.numel() else None for p in parts), implied), bits, group, cols, rows)


def gguf_rows(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K).reshape(rows, cols) + np.float32(0)


@needs_pack
@pytest.mark.parametrize(("rows", "cols", "magnitude"), [(40, 512, 0.05), (7, 768, None), (16, 256, None)])
def test_q6_k_rows_decode_as_gguf_dequantizes_them(rows, cols, magnitude):
    """The packed weight and its embedding rows (any finite fp16 d where magnitude is None) against gguf."""
    raw, weight = q6_k(rows, cols, seed=rows + cols, magnitude=magnitude)
    assert weight.bits == 6 and weight.group_size == 16 and weight.values.shape[1] == 3 * cols // 16
    theirs = gguf_rows(raw, rows, cols)
    ours = weight.dequantize().t().contiguous().numpy() + np.float32(0)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    ids = torch.tensor([rows - 1, 0, rows // 2, 0])
    looked_up = weight.columns(ids).numpy() + np.float32(0)
    assert np.array_equal(looked_up.view(np.uint32), theirs[ids.numpy()].view(np.uint32))


@needs_pack
def test_q6_k_takes_its_file_bytes():
    rows, cols = 32, 512
    raw, weight = q6_k(rows, cols, seed=3)
    resident = weight.values.numel() + weight.compact.nbytes
    assert resident == raw.nbytes  # 0.75 + 1 / 16 + 2 / 256 bytes a weight: 210 / 256, as the file


@needs_pack
def test_expanded_quads_equal_the_torch_packing():
    """six_bit_codes.h's expand_to_quads (through zserve::six_bit_quads) against pack_int8_quads of the codes."""
    for k, n in [(16, 16), (256, 40), (512, 33)]:
        codes = random_codes(k, n, seed=k * n)
        quads = torch.ops.zserve.six_bit_quads(pack_six_bit(codes))
        assert torch.equal(quads, pack_int8_quads(codes))


def six_bit_and_quads(k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, CompactScales]:
    """Random codes as 6-bit codes and as quads, with fp16 x int8 scales per 16 k (a super per 256 or per K)."""
    g = torch.Generator().manual_seed(seed)
    codes = random_codes(k, n, seed)
    num_groups, per_super = k // 16, min(16, k // 16)
    supers = (torch.rand(num_groups // per_super, n, generator=g) * 0.01 + 1e-4).half()
    subs = torch.randint(-128, 128, (num_groups, n), generator=g, dtype=torch.int8)
    compact = CompactScales(pack_column_blocks(supers), pack_column_blocks(subs), None, None)
    return pack_six_bit(codes), pack_int8_quads(codes), compact


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("k", "n"), [(32, 16), (256, 37), (512, 130)])
def test_six_bit_gemm_equals_the_int8_path_bit_for_bit(dtype, k, n):
    six, quads, c = six_bit_and_quads(k, n, seed=k + n)
    bias = padded_bias(torch.randn(n, generator=torch.Generator().manual_seed(1)), six.shape[0])
    for m in ROWS:
        x = random_rows(m, k, seed=m).to(dtype)
        for b in (None, bias):
            def product(codes: torch.Tensor, bits: int, x: torch.Tensor = x, b: torch.Tensor | None = b) -> torch.Tensor:
                return torch.ops.zserve.gemm_dot_compact(x, codes, bits, c.scale_supers, c.scale_subs, None, None, n, b, 16)

            ours, int8_path = product(six, 6), product(quads, 8)
            assert ours.dtype == dtype and torch.equal(ours, int8_path), (m, b is None)


@needs_kernel
@needs_pack
def test_q6_k_weight_kernel_equals_its_int8_unpacked_form():
    """Through the weight kernel: the 6-bit PackedBlocks against its unpacked int8 codes with fp32 scales."""
    from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel, gemm_int8_dot

    _, weight = q6_k(48, 512, seed=11)  # whole blocks of 16 columns (past N the scales take bytes too)
    kernel = ZserveInt8DotKernel()
    six, fp32 = kernel.pack(None, None, weight), kernel.pack(None, None, weight.unpacked())
    assert six.bits == 6 and fp32.bits == 8
    assert kernel.weight_bytes(six, 512, 48, torch.bfloat16) == 48 * 512 * 210 // 256
    for m in (1, 4, 9):
        x = random_rows(m, 512, seed=m).to(torch.bfloat16)
        assert torch.equal(gemm_int8_dot(x, six, None), gemm_int8_dot(x, fp32, None))


@needs_kernel
def test_bad_six_bit_shapes_are_refused():
    six, _, c = six_bit_and_quads(256, 16, seed=0)
    x = torch.randn(1, 512)
    with pytest.raises(RuntimeError, match=r"codes must be contiguous uint8 \[NB, 3K / 16 = 96, 16, 4\]"):
        torch.ops.zserve.gemm_dot_compact(x, six, 6, c.scale_supers, c.scale_subs, None, None, 16, None, 16)
    with pytest.raises(RuntimeError, match="bits must be 4, 6 or 8"):
        torch.ops.zserve.gemm_dot_compact(x[:, :256], six, 5, c.scale_supers, c.scale_subs, None, None, 16, None, 16)
