"""RoPE inverse frequencies and the cos/sin scale, per scaling type, as transformers'
modeling_rope_utils computes them (same fp32 ops in the same order, so the angles match bit for bit).

Two types depend on the sequence length: "dynamic" (NTK: the base grows once the sequence passes
max_position_embeddings) and "longrope" (short factors up to original_max_position_embeddings,
long ones past it). transformers recomputes them at every forward from the largest position in
it (`dynamic_rope_update`); for one sequence in `generate` that is the whole prompt at prefill,
then position + 1 at each decode step. zserve does the same per request: every token of a
request is rotated with the frequencies for the request's length after this step (cached_len +
extend_len), so a batch mixes regimes row by row, and keys already in the cache keep the rotation
they were written with. That equals transformers for one sequence whose prompt is computed in one
step, with one exception and two serving cases:
  - Phi-3's generate (prepare_inputs_for_generation) drops its cache and recomputes the whole
    sequence, long, once it first passes original_max_position_embeddings; zserve keeps the
    short-rotated keys and rotates only the new tokens long (vLLM and llama.cpp recompute nothing
    either). A request that stays on one side of the threshold, or whose prompt starts past it,
    is exact. "dynamic" (Llama's generate) recomputes nothing, like zserve.
  - a prompt longer than the threshold prefilled in chunks has the chunks that end below it
    rotated short (transformers rotates the whole prompt long);
  - a radix hit reuses keys in the regime of the request that wrote them.
"""

from __future__ import annotations

import math

import torch

from zserve.common.model_config import RopeScaling

LENGTH_DEPENDENT = ("dynamic", "longrope")


def default_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """float32[rotary_dim / 2]"""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))


def attention_scaling(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by (yarn's and longrope's attention factor; 1 otherwise)."""
    if scaling is None or scaling.rope_type not in ("yarn", "longrope"):
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    factor = scaling.factor
    if scaling.rope_type == "longrope":
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(scaling.original_max_position_embeddings))
    if scaling.mscale and scaling.mscale_all_dim:
        return float(_yarn_mscale(factor, scaling.mscale) / _yarn_mscale(factor, scaling.mscale_all_dim))
    return _yarn_mscale(factor)


def static_inv_freq(rotary_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """float32[rotary_dim / 2] for the types that do not depend on the sequence length, and the
    short-sequence frequencies of the ones that do."""
    inv_freq = default_inv_freq(rotary_dim, theta)
    if scaling is None or scaling.rope_type == "dynamic":
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3(inv_freq, scaling)
    if scaling.rope_type == "yarn":
        return _yarn(rotary_dim, theta, scaling)
    assert scaling.rope_type == "longrope", scaling
    return longrope_inv_freq(rotary_dim, theta, scaling.short_factor)


def longrope_inv_freq(rotary_dim: int, theta: float, ext_factors: tuple[float, ...]) -> torch.Tensor:
    if len(ext_factors) != rotary_dim // 2:
        raise ValueError(f"longrope: {len(ext_factors)} factors for {rotary_dim // 2} rotary frequencies")
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (torch.tensor(ext_factors, dtype=torch.float32) * theta**shape)


def dynamic_inv_freq(rotary_dim: int, theta: float, scaling: RopeScaling, seq_lens: torch.Tensor) -> torch.Tensor:
    """seq_lens int64[T] -> float32[T, rotary_dim / 2]: NTK base grown for lengths past
    max_position_embeddings. Computed once per distinct length (a step has one per request)."""
    max_len = scaling.max_position_embeddings
    seq_lens = torch.maximum(seq_lens, torch.tensor(max_len, dtype=seq_lens.dtype, device=seq_lens.device))
    lens, token_to_len = torch.unique(seq_lens, return_inverse=True)
    base = theta * ((scaling.factor * lens / max_len) - (scaling.factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=seq_lens.device).float() / rotary_dim
    return (1.0 / (base[:, None] ** shape[None, :]))[token_to_len]


def _llama3(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
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


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than beta_slow times over the original context are
    interpolated (divided by factor), more than beta_fast times kept, a linear ramp between."""

    def correction_dim(num_rotations: float) -> float:
        old_len = scaling.original_max_position_embeddings
        return (dim * math.log(old_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep
