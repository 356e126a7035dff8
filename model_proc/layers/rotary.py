"""Rotary position embedding (NeoX half-split layout, as Hugging Face Llama/Qwen checkpoints use).

Frequencies follow transformers exactly (default, "linear" and Llama-3 "llama3" scaling), and cos/sin
are computed per step from the positions, so no table sized by the context length is kept.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zserve.common.model_config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """float32[head_dim / 2]"""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    assert scaling.rope_type == "llama3", scaling
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between blended
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None):
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions int64[T] -> (cos, sin), each [T, 1, head_dim] in `dtype`; `sin` has its first
        half negated so that rotate_half(x) * sin == swap_halves(x) * sin_signed (see apply_rotary).
        Computed in fp32 and cast to `dtype` last, as transformers does: in bf16 the angle
        pos * inv_freq would be off by up to pos / 512 radians."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, head_dim / 2]
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat((cos, cos), dim=-1)
        sin = torch.cat((-sin, sin), dim=-1)
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] -> same shape. Equals x * cos + rotate_half(x) * sin with
    rotate_half(x) = cat(-x2, x1), written without a negation. Both products are rounded to x's
    dtype before the sum, as in transformers (an addcmul would round once, and in bf16 differ
    from transformers by an ulp in ~1/4 of the elements)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin_signed
