"""Random weights in gemm_int8_dot's packed layouts (kernels/gemm_int8_dot.cpp), as the PackedWeight
its Python wrapper (layers/weight_kernels/int8_kernels.py: gemm_int8_dot) runs: int8 codes in quads,
4-bit codes in nibble pairs or 6-bit codes in units of three rows (kernels/six_bit_codes.h; every byte
value), fp32 or compact scales (fp16 super x int8 sub, or one group per super: the super alone with an
implied offset factor, as Q4_0's -8), offsets or none, a bias or none. For tests that compare the kernel's paths with one another, where any bytes do."""

from __future__ import annotations

import torch

from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight
from zserve.model_proc.weights.compact_scales import CompactScales

COLS = 16  # output columns per packed block


def random_dot_weight(
    k: int, n: int, *, bits: int, group_size: int, compact: bool, offsets: bool, bias: bool, seed: int,
    implied_offset: int = 0,
) -> PackedWeight:
    """A [k, n] weight; compact scales share one super per two groups where the groups allow;
    `implied_offset` (compact, no stored factors): each group's S is its super and O the super times it."""
    g = torch.Generator().manual_seed(seed)
    blocks, groups = -(-n // COLS), -(-k // group_size)
    code_rows = {8: k // 4, 4: k // 8, 6: 3 * k // 16}[bits]
    values = torch.randint(0, 256, (blocks, code_rows, COLS, 4), dtype=torch.uint8, generator=g)
    bias_f32 = torch.randn(blocks * COLS, generator=g) if bias else None
    if compact and implied_offset:
        supers = (torch.rand(blocks, groups, COLS, generator=g) * 1e-3).half()
        scales = CompactScales(supers, None, None, None, implied_offset)
        return PackedWeight(values, n, bias_f32, None, group_size, bits=bits, compact=scales)
    if compact:
        ratio = 2 if groups % 2 == 0 else 1
        supers = (torch.rand(blocks, groups // ratio, COLS, generator=g) * 1e-3).half()
        subs = torch.randint(-127, 128, (blocks, groups, COLS), dtype=torch.int8, generator=g)
        offset_supers = (torch.rand(blocks, groups // ratio, COLS, generator=g) * 1e-3).half() if offsets else None
        offset_subs = torch.randint(-127, 128, (blocks, groups, COLS), dtype=torch.int8, generator=g) if offsets else None
        scales = CompactScales(supers, subs, offset_supers, offset_subs)
        return PackedWeight(values, n, bias_f32, None, group_size, bits=bits, compact=scales)
    scales_f32 = torch.rand(blocks, groups, COLS, generator=g) * 0.02
    offsets_f32 = torch.randn(blocks, groups, COLS, generator=g) * 0.02 if offsets else None
    return PackedWeight(values, n, bias_f32, scales_f32, group_size, offsets=offsets_f32, bits=bits)


def side_by_side(*pieces: PackedWeight) -> PackedWeight:
    """Column pieces, each in its own format (layers/column_pieces.py's packing)."""
    return PackedWeight(torch.empty(0, dtype=torch.uint8), sum(p.out_features for p in pieces), pieces=pieces)
