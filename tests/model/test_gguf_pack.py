"""kernels/gguf_pack.cpp: a GGUF matrix's rows packed straight into the int8 x int8 GEMM's layout
equal gguf_blocks.decode's codes, scales and offsets packed by column_blocks.py, bit for bit, for
every type it packs, with rows picked and reordered (a tensor-parallel shard, llama's q/k rows
un-permuted) and a column count off the 16-column blocks; PackedBlocks unpacks to the same weight
and joins by blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.gguf_random_blocks import random_blocks
from zserve.model_proc.gguf_blocks import decode
from zserve.model_proc.kernels.cpu_kernels import load_gguf_pack
from zserve.model_proc.layers.int4_weights import Int4Weight
from zserve.model_proc.layers.packed_blocks_weight import PackedBlocks, join_blocks
from zserve.model_proc.layers.weight_kernels.column_blocks import (
    pack_column_blocks,
    pack_int4_nibbles,
    pack_int8_quads,
)
from zserve.model_proc.layers.weight_kernels.quantized_weight import join_columns

PACKED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
pytestmark = pytest.mark.skipif(load_gguf_pack() is None, reason="the CPU kernels are not built here")


def packed(type_name: str, raw: np.ndarray, row_ids: torch.Tensor, cols: int) -> PackedBlocks:
    values, scales, offsets, bits, group = torch.ops.zserve.gguf_pack(torch.from_numpy(raw), type_name, row_ids, cols)
    return PackedBlocks(values, scales, offsets if offsets.numel() else None, bits, group, cols, len(row_ids))


def reference(type_name: str, raw: np.ndarray, row_ids: torch.Tensor, cols: int):
    """decode's blocks, rows picked, packed by column_blocks.py."""
    blocks = decode(type_name, raw, raw.shape[0], cols)
    codes = blocks.codes[row_ids].t().contiguous()
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
    assert ours.bits == blocks.bits and ours.group_size == blocks.group_size
    assert torch.equal(ours.values, values)
    # bit for bit: gguf's products in fp32 (compared as bits, +0 and -0 alike)
    assert torch.equal(ours.scales, scales)
    assert (ours.offsets is None) == (offsets is None)
    if offsets is not None:
        assert torch.equal(ours.offsets, offsets)
    unpacked = ours.unpacked()
    assert isinstance(unpacked, Int4Weight) == (blocks.bits == 4)
    exact = blocks.codes[row_ids].float() * blocks.scales[row_ids].repeat_interleave(blocks.group_size, 1)
    if blocks.offsets is not None:
        exact = exact + blocks.offsets[row_ids].repeat_interleave(blocks.group_size, 1)
    assert torch.equal(ours.dequantize(), exact.t())


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
