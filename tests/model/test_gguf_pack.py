"""kernels/gguf_pack.cpp: a GGUF matrix's rows packed straight into the int8 x int8 GEMM's layout
equal gguf_blocks.decode's codes, scales and offsets packed by column_blocks.py, bit for bit, for
every type it packs, with rows picked and reordered (a tensor-parallel shard, llama's q/k rows
un-permuted) and a column count off the 16-column blocks (Q6_K: 6-bit codes, six_bit_codes.py);
PackedBlocks unpacks to the same weight and joins by blocks; one-group blocks keep no per-group
factor (Q4_0's offset is the implied -8 d), so those types take their file's bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.gguf_random_blocks import random_blocks
from zserve.model_proc.kernels.cpu_kernels import load_gguf_pack
from zserve.model_proc.weights.column_blocks import (
    pack_column_blocks,
    pack_int4_nibbles,
    pack_int8_quads,
)
from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.gguf_blocks import decode
from zserve.model_proc.weights.int4_weights import Int4Weight
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks, join_blocks
from zserve.model_proc.weights.quantized_weight import join_columns
from zserve.model_proc.weights.six_bit_codes import pack_six_bit

PACKED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
pytestmark = pytest.mark.skipif(load_gguf_pack() is None, reason="the CPU kernels are not built here")


def packed(type_name: str, raw: np.ndarray, row_ids: torch.Tensor, cols: int) -> PackedBlocks:
    values, *parts, bits, group, implied = torch.ops.zserve.gguf_pack(torch.from_numpy(raw), type_name, row_ids, cols)
    compact = CompactScales(*(part if part.numel() else None for part in parts), implied)
    return PackedBlocks(values, compact, bits, group, cols, len(row_ids))


def reference(type_name: str, raw: np.ndarray, row_ids: torch.Tensor, cols: int):
    """decode's blocks, rows picked, packed by column_blocks.py."""
    blocks = decode(type_name, raw, raw.shape[0], cols)
    codes = blocks.codes[row_ids].t().contiguous()
    if type_name == "Q6_K":
        values = pack_six_bit(codes)
    else:
        values = pack_int4_nibbles(codes) if blocks.bits == 4 else pack_int8_quads(codes)
    scales = pack_column_blocks(blocks.scales[row_ids].t().contiguous())
    offsets = None if blocks.offsets is None else pack_column_blocks(blocks.offsets[row_ids].t().contiguous())
    return values, scales, offsets, blocks


@pytest.mark.parametrize("type_name", PACKED_TYPES)
@pytest.mark.parametrize("rows, cols", [(40, 256), (16, 512)])
def test_packed_rows_equal_the_decoded_blocks_packed(type_name, rows, cols):
    raw = random_blocks(type_name, rows, cols, seed=rows + cols)
    row_ids = torch.randperm(rows, generator=torch.Generator().manual_seed(1))[: rows - 3]  # reordered, 3 left out
    ours = packed(type_name, raw, row_ids, cols)
    values, scales, offsets, blocks = reference(type_name, raw, row_ids, cols)
    assert ours.bits == (6 if type_name == "Q6_K" else blocks.bits) and ours.group_size == blocks.group_size
    assert torch.equal(ours.values, values)
    # bit for bit: gguf's products in fp32 (compared as bits, +0 and -0 alike)
    assert torch.equal(ours.compact.scales(), scales)  # fp16 super x int8 sub: gguf's fp32 product
    assert (ours.compact.offsets() is None) == (offsets is None)
    if offsets is not None:
        assert torch.equal(ours.compact.offsets(), offsets)
    unpacked = ours.unpacked()
    assert isinstance(unpacked, Int4Weight) == (blocks.bits == 4)
    exact = blocks.codes[row_ids].float() * blocks.scales[row_ids].repeat_interleave(blocks.group_size, 1)
    if blocks.offsets is not None:
        exact = exact + blocks.offsets[row_ids].repeat_interleave(blocks.group_size, 1)
    assert torch.equal(ours.dequantize(), exact.t())


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0"])
def test_one_group_blocks_take_their_file_bytes(type_name):
    """Q8_0, Q4_0, Q4_1 (and Q5_0, widened to int8 codes) keep the file's fp16 d (and m) and no factor per group:
    S = d, O = -8 d (Q4_0) or m (Q4_1) implied by the type."""
    rows, cols = 32, 512
    raw = random_blocks(type_name, rows, cols, seed=5)
    ours = packed(type_name, raw, torch.arange(rows), cols)
    assert ours.compact.scale_subs is None and ours.compact.offset_subs is None
    assert ours.compact.implied_offset == {"Q4_0": -8, "Q4_1": 1}.get(type_name, 0)
    resident = ours.values.numel() + ours.compact.nbytes
    widened = rows * cols * 12 // 32 if type_name == "Q5_0" else 0  # Q5_0: a byte a code, where the file has 20 / 32
    assert resident == raw.nbytes + widened, (resident, raw.nbytes)


def test_a_type_or_shape_it_does_not_pack_is_refused():
    raw = random_blocks("Q4_0", 4, 64, seed=0)
    assert not torch.ops.zserve.gguf_pack_supports("IQ2_XXS") and torch.ops.zserve.gguf_pack_supports("Q4_K")
    with pytest.raises(RuntimeError, match="IQ2_XXS is not packed here"):
        torch.ops.zserve.gguf_pack(torch.from_numpy(raw), "IQ2_XXS", torch.arange(4), 64)
    with pytest.raises(RuntimeError, match="raw must be contiguous uint8"):
        torch.ops.zserve.gguf_pack(torch.from_numpy(raw), "Q4_0", torch.arange(4), 96)
    with pytest.raises(RuntimeError, match="row id 4 outside 4 rows"):
        torch.ops.zserve.gguf_pack(torch.from_numpy(raw), "Q4_0", torch.tensor([0, 4]), 64)


def test_pieces_join_by_blocks_or_through_their_codes():
    q_raw, v_raw = random_blocks("Q4_K", 32, 256, seed=1), random_blocks("Q6_K", 16, 256, seed=2)
    q = packed("Q4_K", q_raw, torch.arange(32), 256)
    k = packed("Q4_K", q_raw, torch.arange(16), 256)
    v = packed("Q6_K", v_raw, torch.arange(16), 256)
    joined = join_blocks([(0, q), (32, k)], 48)
    assert joined is not None and joined.values.shape[0] == 3
    assert torch.equal(joined.dequantize(), torch.cat([q.dequantize(), k.dequantize()], dim=1))
    mixed = join_columns([(0, q), (32, k), (48, v)], 64)  # 4-bit and int8 pieces: joined as int8 codes, exactly
    assert not isinstance(mixed, PackedBlocks)
    assert torch.equal(mixed.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()], dim=1))
    odd = packed("Q4_K", q_raw, torch.arange(8), 256)  # 8 columns: not whole blocks, so not joined by blocks
    assert join_blocks([(0, odd), (8, k)], 24) is None
    assert torch.equal(join_columns([(0, odd), (8, k)], 24).dequantize(), torch.cat([odd.dequantize(), k.dequantize()], 1))


@pytest.mark.parametrize("type_name", PACKED_TYPES)
def test_the_gemm_on_compact_scales_equals_it_on_fp32_ones(type_name):
    """gemm_dot_compact (S = fp16 super x int8 sub, computed per group in the kernel) against the fp32-scale ops
    on the same weight: bit-identical outputs, with and without a bias, for 1, 3 and 9 rows."""
    from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
    from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel, gemm_int8_dot

    if load_gemm_int8_dot() is None:
        pytest.skip("the int8 x int8 GEMM is not built here")
    rows, cols = 40, 512
    raw = random_blocks(type_name, rows, cols, seed=7, magnitude=0.05)
    weight = packed(type_name, raw, torch.arange(rows), cols)
    bias = torch.randn(rows, generator=torch.Generator().manual_seed(3))
    kernel = ZserveInt8DotKernel()
    compact = kernel.pack(None, bias, weight)
    fp32 = kernel.pack(None, bias, weight.unpacked())
    assert compact.compact is not None and fp32.compact is None
    assert kernel.weight_bytes(compact, cols, rows, torch.bfloat16) < kernel.weight_bytes(fp32, cols, rows, torch.bfloat16)
    for m in (1, 3, 9):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        for b in (None, bias):
            assert torch.equal(gemm_int8_dot(x, compact, b), gemm_int8_dot(x, fp32, b)), (type_name, m, b is None)


def test_pieces_of_two_types_stay_each_in_its_own():
    """Q4_K_M's q, k (Q4_K) beside a Q6_K v: ColumnPieces, one product per piece (not one int8 join at 1.5 bytes
    a weight); a kernel without pieces (int8_torch) gets their exact int8 join."""
    from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
    from zserve.model_proc.layers.gemm import GemmWeight
    from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8TorchKernel, ZserveInt8DotKernel, gemm_int8_dot
    from zserve.model_proc.weights.column_pieces import ColumnPieces
    from zserve.model_proc.weights.quantized_weight import unpacked_join

    q = packed("Q4_K", random_blocks("Q4_K", 32, 256, seed=1, magnitude=0.05), torch.arange(32), 256)
    v = packed("Q6_K", random_blocks("Q6_K", 24, 256, seed=2, magnitude=0.05), torch.arange(24), 256)
    pieces = join_columns([(0, q), (32, v)], 56)
    assert isinstance(pieces, ColumnPieces) and pieces.column_offsets() == [0, 32]
    exact = torch.cat([q.dequantize(), v.dequantize()], dim=1)
    assert torch.equal(pieces.dequantize(), exact) and torch.equal(unpacked_join(pieces).dequantize(), exact)
    assert join_columns([(0, v), (24, q)], 56) is not None and ColumnPieces.of([(0, v), (24, q)], 56) is None  # 24: not whole blocks
    bias = torch.randn(56, generator=torch.Generator().manual_seed(4))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    reference = Int8TorchKernel()
    layer = GemmWeight()
    layer.init_weight(256, 56)
    layer.stored_parts = [(0, q), (32, v)]
    layer.pack(reference)  # pieces unpacked and joined as int8 codes, exactly
    assert torch.equal(layer.packed.values, unpacked_join(pieces).q)
    if load_gemm_int8_dot() is None:
        return
    kernel = ZserveInt8DotKernel()
    split = kernel.pack(None, bias, pieces)
    assert [p.bits for p in split.pieces] == [4, 6] and split.values.numel() == 0
    joined = kernel.pack(None, bias, unpacked_join(pieces))
    assert kernel.weight_bytes(split, 256, 56, torch.bfloat16) < kernel.weight_bytes(joined, 256, 56, torch.bfloat16)
    each = [kernel.pack(None, bias[c : c + p.out_features], p) for c, p in zip((0, 32), (q, v), strict=True)]
    assert torch.equal(gemm_int8_dot(x, split, bias), torch.cat([gemm_int8_dot(x, p, bias) for p in each], dim=1))
    assert torch.allclose(gemm_int8_dot(x, split, bias).float(), gemm_int8_dot(x, joined, bias).float(), rtol=0.02, atol=0.02)
