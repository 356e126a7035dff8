"""Activations quantized to int8, the rule of the int8 x int8 GEMM (kernels/gemm_int8_dot.cpp),
in torch: what that kernel computes, written so tests and the oracle can compute it too.

Each row of x [M, K] (K a multiple of 32) is quantized in blocks of ACT_BLOCK = 32 along K, as
llama.cpp's Q8_0 does for its activations: s = max|x| / 127 and xq = round-half-even(x * (127 /
max|x|)), in fp32 (a block of zeros: s = 0, xq = 0). The GEMM then multiplies xq by the int8
weight exactly (int32 sums per block) and scales each block's sum by s and the weight's scale: its
result is `fake_quantize(x) @ (Q * S)`, with the sums in fp32 instead of exactly.
"""

from __future__ import annotations

import torch

ACT_BLOCK = 32  # k per activation scale
SUM_BLOCK = 16  # k per partial sum of the quantized activations (offsets' term; GGUF Q6_K's groups)
QMAX = 127


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype, K a multiple of 32) -> (xq int8 [M, K], s float32 [M, K / 32])."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // ACT_BLOCK, ACT_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    inverse = torch.where(amax > 0, torch.tensor(float(QMAX)) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse[..., None]).to(torch.int8)
    return q.reshape(m, k), amax / QMAX


def fake_quantize(x: torch.Tensor) -> torch.Tensor:
    """float32 [M, K]: the values the int8 GEMM multiplies for x, xq * s."""
    q, scales = quantize_activations(x)
    return (q.float().reshape(*scales.shape, ACT_BLOCK) * scales[..., None]).reshape(q.shape)


def runs_int8_activations(in_features: int) -> bool:
    """Whether a weight of `in_features` rows fits the int8 x int8 GEMM (K a multiple of 32)."""
    return in_features > 0 and in_features % ACT_BLOCK == 0
