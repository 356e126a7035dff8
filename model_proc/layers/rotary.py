"""Rotary position embedding (NeoX half-split layout, as Hugging Face Llama/Qwen/Phi checkpoints use).

Frequencies follow transformers exactly for every scaling type (rope_frequencies.py), and cos/sin
are computed per step from the positions, so no table sized by the context length is kept. With a
partial rotary (Phi-4-mini), only the first `rotary_dim` dims of each head rotate, NeoX halves
within them; the rest pass through:

    head   | x0 .. x(r/2 - 1) | x(r/2) .. x(r - 1) | x(r) .. x(d - 1) |
             rotated together (r = rotary_dim)       passed through
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.common.model_config import RopeScaling
from zserve.model_proc.layers.rope_frequencies import (
    LENGTH_DEPENDENT,
    attention_scaling,
    dynamic_inv_freq,
    longrope_inv_freq,
    static_inv_freq,
)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None, rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        self.theta, self.scaling = theta, scaling
        self.attention_scaling = attention_scaling(scaling)
        self.register_buffer("inv_freq", static_inv_freq(self.rotary_dim, theta, scaling), persistent=False)
        long = scaling is not None and scaling.rope_type == "longrope"
        long_inv_freq = longrope_inv_freq(self.rotary_dim, theta, scaling.long_factor) if long else self.inv_freq
        self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)

    @property
    def length_dependent(self) -> bool:
        return self.scaling is not None and self.scaling.rope_type in LENGTH_DEPENDENT

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype, seq_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions int64[T] -> (cos, sin), each [T, 1, rotary_dim] in `dtype`; `sin` has its first
        half negated so that rotate_half(x) * sin == swap_halves(x) * sin_signed (see apply_rotary).
        seq_lens int64[T]: each token's request length after this step, read by "dynamic" and
        "longrope" (see rope_frequencies.py). Computed in fp32 and cast to `dtype` last, as
        transformers does: in bf16 the angle pos * inv_freq would be off by up to pos / 512 radians."""
        freqs = positions[:, None].float() * self._inv_freq(positions, seq_lens)  # [T, rotary_dim / 2]
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat((cos, cos), dim=-1) * self.attention_scaling
        sin = torch.cat((-sin, sin), dim=-1) * self.attention_scaling
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def _inv_freq(self, positions: torch.Tensor, seq_lens: torch.Tensor | None) -> torch.Tensor:
        """[1 or T, rotary_dim / 2]"""
        if not self.length_dependent:
            return self.inv_freq[None, :]
        assert seq_lens is not None and seq_lens.shape == positions.shape, "this RoPE type needs each token's seq_len"
        if self.scaling.rope_type == "dynamic":
            return dynamic_inv_freq(self.rotary_dim, self.theta, self.scaling, seq_lens)
        is_long = (seq_lens > self.scaling.original_max_position_embeddings)[:, None]
        return torch.where(is_long, self.long_inv_freq[None, :], self.inv_freq[None, :])


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] -> same shape. Equals x * cos + rotate_half(x) * sin with
    rotate_half(x) = cat(-x2, x1), written without a negation, over the first cos.shape[-1] dims
    (the rest pass through). Both products are rounded to x's dtype before the sum, as in
    transformers (an addcmul would round once, and in bf16 differ from transformers by an ulp in
    ~1/4 of the elements)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin_signed), x[..., rotary_dim:]), dim=-1)
    half = rotary_dim // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin_signed
