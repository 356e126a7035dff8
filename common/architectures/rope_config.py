"""RoPE settings in config.json, read as transformers' modeling_rope_utils reads them. Both spellings
are read: the older top-level `rope_theta` + `rope_scaling`, and transformers 5's `rope_parameters`.
An architecture's quirks (Phi-3's old type names) come from its spec (RopeQuirks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.architectures.arch_spec import RopeQuirks
from zserve.common.architectures.config_field import config_field

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope_parameters keys each type reads (besides rope_type, rope_theta, factor, partial_rotary_factor); others refused
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": (),
    "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
        "truncate",
    ),
    "dynamic": (),
    "longrope": ("original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"),
}
DEFAULT_ROPE_THETA = 10_000.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling, as transformers' modeling_rope_utils reads it: `rope_type` is "linear",
    "llama3" (Llama 3.1), "yarn", "dynamic" (NTK-aware, base grown with the sequence length) or
    "longrope" (Phi-3: per-frequency short/long factors). model_proc/layers/rope_frequencies.py
    computes the frequencies."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 8192  # config.json's: "dynamic" grows the base past it
    attention_factor: float | None = None  # yarn / longrope: multiplies cos and sin; None: from `factor`
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # yarn: 0 means unset, as transformers tests it (`if mscale and mscale_all_dim`)
    mscale_all_dim: float = 0.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()  # longrope: one per rotary frequency
    long_factor: tuple[float, ...] = ()


def rope_config(raw: dict[str, Any], path: Path, quirks: RopeQuirks) -> tuple[float, RopeScaling | None]:
    """theta and scaling from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`.
    Keys a rope type does not read, and types we do not implement, are refused, never ignored."""
    params = _rope_params(raw, path)
    theta = float(params.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = dict(quirks.type_aliases).get(rope_type, rope_type)  # what the config class reads old names as
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{path}: rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    known = {"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor", *ROPE_KEYS[rope_type]}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{path}: rope type {rope_type!r} with {', '.join(unknown)} is not supported")
    if rope_type == "default":
        return theta, None
    max_len = config_field(raw, path, ("max_position_embeddings",), 8192, int)
    # transformers: a top-level original_max_position_embeddings (Phi-3 always has one, 4096 by
    # default) wins over the one in rope_parameters, which wins over max_position_embeddings
    original_max_len = raw.get("original_max_position_embeddings", quirks.original_max_len_default)
    original_max_len = int(original_max_len or params.get("original_max_position_embeddings") or max_len)
    if rope_type == "longrope":
        factor = float(params.get("factor") or max_len / original_max_len)
    elif "factor" not in params:
        raise ValueError(f"{path}: rope type {rope_type!r} needs a 'factor'")
    else:
        factor = float(params["factor"])
    attention_factor = params.get("attention_factor")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original_max_len,
        max_position_embeddings=max_len,
        attention_factor=None if attention_factor is None else float(attention_factor),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        truncate=bool(params.get("truncate", True)),
        short_factor=_factor_list(params, "short_factor", path),
        long_factor=_factor_list(params, "long_factor", path),
    )
    if rope_type == "longrope" and not (scaling.short_factor and scaling.long_factor):
        raise ValueError(f"{path}: rope type 'longrope' needs 'short_factor' and 'long_factor'")
    return theta, scaling


def extended_len(scaling: RopeScaling) -> float:
    """The context a yarn / dynamic scaling stretches the model to."""
    if scaling.rope_type == "yarn":
        return scaling.original_max_position_embeddings * scaling.factor
    return scaling.max_position_embeddings * scaling.factor


def _rope_params(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))
    if not isinstance(params, dict):
        raise ValueError(f"{path}: 'rope_parameters' must be an object, got {params!r}")
    return params


def _factor_list(params: dict[str, Any], key: str, path: Path) -> tuple[float, ...]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
        raise ValueError(f"{path}: rope {key!r} must be a list of numbers, got {value!r}")
    return tuple(float(v) for v in value)


def partial_rotary_factor(raw: dict[str, Any], path: Path, head_dim: int) -> float:
    """The fraction of each head that rotates (Phi-4-mini: 0.75), from rope_parameters or the top level."""
    factor = _rope_params(raw, path).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise ValueError(f"{path}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"{path}: partial_rotary_factor {factor} rotates {rotary_dim} of {head_dim} dims; need even")
    return float(factor)
