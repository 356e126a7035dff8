"""4-bit weights: as a GGUF file stores them (Q4_0, Q4_1, Q4_K: model_proc/weights/gguf_blocks.py decodes
them), or quantized at load from a 16-bit checkpoint (--quantization int4: `Int4Weight.quantize`),
kept packed in memory and multiplied by the int8 x int8 kernel's 4-bit path
(kernels/gemm_int8_dot.cpp, gemm_int4_dot).

A weight W [K, N] ([in, out]) is unsigned codes C in [0, 15] with a scale S and an offset O per
group of G input rows and output column: W = C * S + O, in float32, in that order (Q4_0:
S = d, O = -8 d; Q4_1: S = d, O = m; Q4_K: S = d * sc, O = -(dmin * m), G = 32), which is how
gguf's own dequantization computes them, so `dequantize()` equals it bit for bit.

--quantization int4 is asymmetric in groups of INT4_GROUP_SIZE (32) input rows, as Q4_1: S = (max -
min) / 15, O = min, C = round((W - min) / S) clamped to [0, 15] (a constant group: S = 0, C = 0,
O = its value), so |W - (C S + O)| <= S / 2.

Packed two codes to a byte (weight_kernels/column_blocks.py `pack_int4_nibbles`) with fp32 S and
O per 32 rows: 0.75 bytes a weight (llama.cpp's Q4_0 0.5625, Q4_K 0.5625: its scales are fp16 or
6-bit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zserve.model_proc.weights.int8_weights import Int8Weight

INT4_GROUP_SIZE = 32  # input rows per scale and offset, --quantization int4
INT4_MAX = 15


@dataclass(frozen=True)
class Int4Weight:
    codes: torch.Tensor  # uint8 [K, N], values 0..15
    scales: torch.Tensor  # float32 [ceil(K / G), N]
    offsets: torch.Tensor  # float32 [ceil(K / G), N]
    group_size: int

    @staticmethod
    def quantize(weight_in_out: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
        """W [K, N] (any float dtype, K a multiple of `group_size`) in groups of `group_size` rows; see the top."""
        k, n = weight_in_out.shape
        grouped = weight_in_out.detach().float().reshape(k // group_size, group_size, n)
        low, high = grouped.amin(dim=1), grouped.amax(dim=1)
        scales = (high - low) / INT4_MAX
        inverse = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
        codes = torch.round((grouped - low[:, None]) * inverse[:, None]).clamp_(0, INT4_MAX).to(torch.uint8)
        return Int4Weight(codes.reshape(k, n), scales.contiguous(), low.contiguous(), group_size)

    @property
    def in_features(self) -> int:
        return self.codes.shape[0]

    @property
    def out_features(self) -> int:
        return self.codes.shape[1]

    def dequantize(self) -> torch.Tensor:
        """float32 [K, N]: C * S + O, the weight this stands for."""
        k = self.codes.shape[0]
        scales = self.scales.repeat_interleave(self.group_size, dim=0)[:k]
        offsets = self.offsets.repeat_interleave(self.group_size, dim=0)[:k]
        return self.codes.float() * scales + offsets

    def as_int8(self) -> Int8Weight:
        """The same values as int8 codes with offsets (a byte per weight), to join an int8 piece."""
        return Int8Weight(self.codes.to(torch.int8), self.scales, self.group_size, self.offsets)


def common_format(parts: Sequence[Int8Weight | Int4Weight]) -> list[Int8Weight | Int4Weight] | None:
    """The pieces of one fused weight (q, k, v; gate, up) in one format with the same settings,
    values unchanged, or None when that cannot be done exactly: 4-bit pieces become int8 codes
    with offsets when any piece is int8 or their groups differ, and groups become the smallest
    (each a divisor of the others: GGUF's 16 and 32)."""
    if not all(isinstance(p, (Int8Weight, Int4Weight)) for p in parts):
        return None
    group = min(p.group_size for p in parts)
    if any(p.group_size % group for p in parts):
        return None
    if all(isinstance(p, Int4Weight) for p in parts) and all(p.group_size == group for p in parts):
        return list(parts)
    as_int8 = [p.as_int8() if isinstance(p, Int4Weight) else p for p in parts]
    regrouped = [p.regrouped(group) for p in as_int8]
    if any(p.offsets is not None for p in regrouped):
        regrouped = [p.with_offsets() for p in regrouped]
    return regrouped
