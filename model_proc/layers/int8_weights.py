"""8-bit weights (--quantization int8): the quantizer, its exact dequantization, and the block
layout of kernels/gemm_int8.cpp.

A weight W [K, N] ([in, out], as gemm.py keeps it) becomes int8 values Q [K, N] and float32
scales S [ceil(K / G), N]: symmetric, one scale per output column for each group of G input
rows (the last group may be shorter), S = max|W| over the group / 127 and Q = round(W / S),
so W ~ Q * S with |W - Q * S| <= S / 2. G = K is one scale per output channel.

DEFAULT_GROUP_SIZE (64) was picked on SmolLM2-135M-Instruct (tests/model/test_int8_quality.py:
30 chat prompts, chat template, 32 greedy tokens, batched, against the bf16 run; 2026-11-26):

    scheme                    greedy agreement      mean KL(bf16 || int8)   bytes per weight
                              to EOS / 32 tokens    (teacher forcing)
    one scale per column          - / 0.54               0.0055                1.00
    groups of 128                 - / 0.61               0.0039                1.03
    groups of 64              0.74 / 0.69                0.0035                1.06
    groups of 32                  - / 0.61               0.0032                1.13
    (bf16 weights, fp32 compute) 0.78 / 0.72             0.0011                (the noise floor:
                                                                               bf16 rounding alone)

KL falls with the group; greedy agreement is dominated by near-ties (bf16's own rounding moves
as many tokens), so 64 is where KL stops paying for the scale bytes; the kernel's speed barely
depends on G (one scale FMA per group and column). A GGUF Q8_0 tensor
arrives already quantized in groups of 32 along K with fp16 scales; gguf_checkpoint.py hands
its values over as they are (`Int8Preset`), so that layer runs with G = 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTIZATION_CHOICES = ("none", "int8")
DEFAULT_GROUP_SIZE = 64  # input rows per scale; see the table above
GROUP_SIZES = (32, 64, 128)  # the grouped schemes measured; any G in [1, K] runs
QMAX = 127  # symmetric: -127..127 (-128 never produced)
BLOCK_COLS = 16  # output columns per packed block, as gemm_widen's


def num_groups(in_features: int, group_size: int) -> int:
    return -(-in_features // group_size)


def quantize_int8(weight_in_out: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W [K, N] (any float dtype) -> (Q int8 [K, N], S float32 [ceil(K / G), N]); see the top.
    `group_size` >= K (or 0) gives one scale per output column."""
    k, n = weight_in_out.shape
    group_size = k if group_size <= 0 or group_size > k else group_size
    ng = num_groups(k, group_size)
    w = weight_in_out.detach().float()
    padded = torch.zeros(ng * group_size, n, dtype=torch.float32, device=w.device)
    padded[:k] = w
    grouped = padded.view(ng, group_size, n)
    scales = grouped.abs().amax(dim=1) / QMAX  # [ng, N]
    inverse = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    q = torch.round(grouped * inverse[:, None, :]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.view(ng * group_size, n)[:k].contiguous(), scales.contiguous()


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The exact float32 weight the int8 path multiplies by: Q * S, S repeated over its group."""
    k = q.shape[0]
    group_size = k if group_size <= 0 or group_size > k else group_size
    return q.float() * scales.repeat_interleave(group_size, dim=0)[:k]


def pack_column_blocks(values: torch.Tensor) -> torch.Tensor:
    """[R, N] -> [ceil(N / 16), R, 16], zero-padded columns (gemm_widen's layout): the int8
    values ([K, N]) and the scales ([K / G, N]) of one block of 16 output columns together."""
    rows, n = values.shape
    padded_n = -(-n // BLOCK_COLS) * BLOCK_COLS
    padded = torch.zeros(rows, padded_n, dtype=values.dtype, device=values.device)
    padded[:, :n] = values
    return padded.view(rows, padded_n // BLOCK_COLS, BLOCK_COLS).permute(1, 0, 2).contiguous()


@dataclass
class Int8Preset:
    """A weight that arrived quantized (GGUF Q8_0): Q int8 [K, N] and S float32 [K / G, N] of
    the [in, out] weight, filled row range by row range of the output (fused q/k/v); the
    layer uses it when every output column came so, and quantizes its float weight otherwise."""

    q: torch.Tensor
    scales: torch.Tensor
    group_size: int
    filled_cols: int = 0

    @property
    def complete(self) -> bool:
        return self.filled_cols == self.q.shape[1]
