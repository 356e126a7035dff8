"""A GGUF matrix already in the int8 x int8 GEMM's layout (kernels/gguf_pack.cpp packed it from the
file's rows in one pass at load), on its way from the reader to the kernel.

`PackedBlocks` is a QuantizedWeight (weight_kernels/quantized_weight.py) whose tensors have the
16-column blocks first: nibbles or quads [NB, K / (8 or 4), 16, 4] (column_blocks.py's layouts) or
Q6_K's 6-bit codes [NB, 3K / 16, 16, 4] (six_bit_codes.py), and
the scales and offsets as the file keeps them (compact_scales.py). Pieces of a fused weight whose
columns are whole blocks join by concatenating blocks (`join_blocks`); anything else (a piece of
another type, a float piece, a kernel other than zserve_int8_dot) gets `unpacked()`: the same values as an Int4Weight or
Int8Weight, through the reference path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zserve.model_proc.weights.block_cat import cat_blocks
from zserve.model_proc.weights.column_blocks import BLOCK_COLS
from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.int4_weights import Int4Weight
from zserve.model_proc.weights.int8_weights import Int8Weight
from zserve.model_proc.weights.six_bit_codes import six_bit_codes


@dataclass(frozen=True)
class PackedBlocks:
    values: torch.Tensor  # uint8 nibbles [NB, K / 8, 16, 4] (bits 4), 6-bit C + 32 [NB, 3K / 16, 16, 4] (bits 6)
    #                       or quads of C + 128 [NB, K / 4, 16, 4] (bits 8)
    compact: CompactScales  # S and O per group of G rows and column, as the file keeps them
    bits: int
    group_size: int
    in_features: int
    out_features: int

    def unpacked(self) -> Int4Weight | Int8Weight:
        """The same weight with [K, N] codes (column_blocks.py's packing undone)."""
        nb, k, n = self.values.shape[0], self.in_features, self.out_features
        if self.bits == 4:  # [NB, K/8, 16, 4]: low nibbles k = 8p + i, high nibbles 8p + 4 + i
            low, high = self.values & 0x0F, self.values >> 4
            codes = torch.stack([low, high], dim=3)  # [NB, K/8, 16, 2, 4]
            codes = codes.permute(1, 3, 4, 0, 2).reshape(k, nb * BLOCK_COLS)  # [K/8, 2, 4, NB, 16] -> [K, N']
        elif self.bits == 6:  # [NB, 3K/16, 16, 4] -> per column [NB, 16, K] -> [K, N']
            codes = six_bit_codes(self.values.permute(0, 2, 1, 3)).to(torch.int8)
            codes = codes.permute(2, 0, 1).reshape(k, nb * BLOCK_COLS)
        else:  # [NB, K/4, 16, 4] of C + 128
            shifted = self.values.permute(1, 3, 0, 2).reshape(k, nb * BLOCK_COLS)
            codes = (shifted.to(torch.int16) - 128).to(torch.int8)
        codes = codes[:, :n].contiguous()

        def side(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.permute(1, 0, 2).reshape(t.shape[1], -1)[:, :n].contiguous()

        scales, offsets = side(self.compact.scales()), side(self.compact.offsets())
        if self.bits == 4:
            assert offsets is not None, "4-bit codes always have offsets"
            return Int4Weight(codes, scales, offsets, self.group_size)
        return Int8Weight(codes, scales, self.group_size, offsets)

    def dequantize(self) -> torch.Tensor:
        """float32 [K, N]: C * S + O, the weight this stands for."""
        return self.unpacked().dequantize()

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [T, K]: columns `ids` (int64 [T]) of the weight, decoded as `dequantize` decodes
        them (C * S, then + O, in fp32): an embedding table's rows, looked up without a float copy."""
        block, col = ids // BLOCK_COLS, ids % BLOCK_COLS
        picked = self.values[block, :, col, :]  # [T, K / 8, 3K / 16 or K / 4, 4]
        num_ids, k = ids.shape[0], self.in_features
        if self.bits == 4:  # bytes (p, i): k = 8p + i low, 8p + 4 + i high
            codes = torch.stack([picked & 0x0F, picked >> 4], dim=2).reshape(num_ids, k)
        elif self.bits == 6:
            codes = six_bit_codes(picked)
        else:
            codes = picked.reshape(num_ids, k).to(torch.int16) - 128
        picked_scales = self.compact.picked(block, col)
        values = codes.float() * picked_scales.scales()[..., 0].repeat_interleave(self.group_size, dim=1)
        offsets = picked_scales.offsets()
        if offsets is not None:
            values = values + offsets[..., 0].repeat_interleave(self.group_size, dim=1)
        return values


def join_blocks(parts: Sequence[tuple[int, object]], out_features: int) -> PackedBlocks | None:
    """The pieces side by side as one PackedBlocks, when they are all PackedBlocks of one format,
    in order, covering every column, each but the last a whole number of 16-column blocks; else None."""
    if not parts or not all(isinstance(part, PackedBlocks) for _, part in parts):
        return None
    first: PackedBlocks = parts[0][1]
    next_col = 0
    for i, (col, part) in enumerate(parts):
        same = (part.bits, part.group_size, part.in_features) == (first.bits, first.group_size, first.in_features)
        same = same and part.compact.same_form(first.compact)
        whole_blocks = part.out_features % BLOCK_COLS == 0 or i == len(parts) - 1
        if col != next_col or not same or not whole_blocks:
            return None
        next_col += part.out_features
    if next_col != out_features:
        return None
    if len(parts) == 1:
        return first
    return PackedBlocks(
        cat_blocks([p.values for _, p in parts]), CompactScales.cat([p.compact for _, p in parts]), first.bits,
        first.group_size, first.in_features, out_features,
    )
