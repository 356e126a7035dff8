"""8-bit weights (--quantization int8): the quantizer, its exact dequantization, and `Int8Weight`,
the typed weight the int8 kernels pack (model_proc/layers/weight_kernels/int8_kernels.py).

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
arrives already quantized in groups of 32 along K with fp16 scales; gguf_checkpoint.py returns
its values as they are (an `Int8Weight` from `read_weight`), so that layer runs with G = 32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from zserve.common.int_math import cdiv

DEFAULT_GROUP_SIZE = 64  # input rows per scale; see the table above
GROUP_SIZES = (32, 64, 128)  # the grouped schemes measured; any G in [1, K] runs
QMAX = 127  # symmetric: -127..127 (-128 never produced)


def num_groups(in_features: int, group_size: int) -> int:
    return cdiv(in_features, group_size)


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


def dequantize_int8(
    q: torch.Tensor, scales: torch.Tensor, group_size: int, offsets: torch.Tensor | None = None
) -> torch.Tensor:
    """The exact float32 weight the int8 path multiplies by: Q * S (+ O), S and O repeated over their group."""
    k = q.shape[0]
    group_size = k if group_size <= 0 or group_size > k else group_size
    w = q.float() * scales.repeat_interleave(group_size, dim=0)[:k]
    return w if offsets is None else w + offsets.repeat_interleave(group_size, dim=0)[:k]


@dataclass(frozen=True)
class Int8Weight:
    """A [in, out] weight in int8 (see the top): `q` int8 [K, N] and `scales` float32
    [ceil(K / G), N]; each tensor has the output columns last, so pieces of one fused weight
    (q, k, v) sit side by side (weight_kernels/quantized_weight.py). What a checkpoint that stores
    int8 returns (GGUF Q8_0: G = 32) and what the int8 kernels pack. `offsets` (float32 like the
    scales, or None) make it Q * S + O: a GGUF file's 5-bit codes (Q5_K), or 4-bit ones joined with
    int8 ones in a fused weight (weights/int4_weights.py); only the int8 x int8 kernel takes them."""

    q: torch.Tensor
    scales: torch.Tensor
    group_size: int
    offsets: torch.Tensor | None = None

    @staticmethod
    def quantize(weight_in_out: torch.Tensor, group_size: int) -> Int8Weight:
        """W [K, N] in groups of `group_size` input rows (0 or >= K: one scale per column)."""
        in_features = weight_in_out.shape[0]
        group_size = min(group_size, in_features) if group_size > 0 else in_features
        return Int8Weight(*quantize_int8(weight_in_out, group_size), group_size)

    @property
    def in_features(self) -> int:
        return self.q.shape[0]

    @property
    def out_features(self) -> int:
        return self.q.shape[1]

    def dequantize(self) -> torch.Tensor:
        """float32 [K, N]: Q * S (+ O), the weight this stands for."""
        return dequantize_int8(self.q, self.scales, self.group_size, self.offsets)

    def regrouped(self, group_size: int) -> Int8Weight:
        """The same weight with scales (and offsets) per `group_size` rows, a divisor of this one's
        group: each scale repeated, so the values do not change."""
        if group_size == self.group_size:
            return self
        assert self.group_size % group_size == 0, (self.group_size, group_size)
        k = self.q.shape[0]
        repeat = self.group_size // group_size
        groups = cdiv(k, group_size)
        scales = self.scales.repeat_interleave(repeat, dim=0)[:groups]
        offsets = None if self.offsets is None else self.offsets.repeat_interleave(repeat, dim=0)[:groups]
        return Int8Weight(self.q, scales, group_size, offsets)

    def with_offsets(self) -> Int8Weight:
        """The same weight with explicit (zero) offsets."""
        return self if self.offsets is not None else replace(self, offsets=torch.zeros_like(self.scales))
