"""Gemma 2 / Gemma 3 settings in config.json, read as transformers reads them (no torch here).

`gemma_text_config` turns a Gemma config.json into the flat form the generic parser
(common/model_config.py) reads: the `text_config` of a Gemma 3 multimodal checkpoint lifted to the
top, transformers' class defaults for missing keys (Gemma 3 multimodal configs omit most of them),
`hidden_activation` as `hidden_act`, and Gemma 3's per-layer-type RoPE (`rope_parameters` keyed by
"full_attention" / "sliding_attention", or the older `rope_theta` + `rope_scaling` +
`rope_local_base_freq`) reduced to the global layers' settings. `gemma_fields` then gives what the
generic parser does not know: softmax scale, final soft-capping, which layers are local (for their
RoPE; their windows are layer_windows.py's) and the local RoPE base. What differs between the two
is a GemmaRules record (gemma_rules.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zserve.common.architectures.gemma_rules import GemmaRules

SLIDING, FULL = "sliding_attention", "full_attention"


def gemma_text_config(rules: GemmaRules, raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """config.json of a Gemma 2 / 3 checkpoint, flattened for the generic parser (see the module doc)."""
    if "text_config" in raw:  # Gemma3ForConditionalGeneration: the decoder is the text model
        text = raw["text_config"]
        if not isinstance(text, dict):
            raise ValueError(f"{path}: 'text_config' must be an object, got {text!r}")
        outer = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
        raw = {**text, **outer}
    flat = {**rules.defaults, **raw}
    flat["hidden_act"] = flat["hidden_activation"]  # transformers' Gemma reads this key, not hidden_act
    if rules.local_rope:
        full, local = _local_rope(flat, path)
        flat["rope_parameters"] = full
        flat["rope_local_base_freq"] = local
    return flat


def _local_rope(flat: dict[str, Any], path: Path) -> tuple[dict[str, Any], float]:
    """(the global layers' rope_parameters, the local layers' RoPE base), as Gemma3TextConfig builds them."""
    params = flat.get("rope_parameters")
    if params is None:  # the older spelling: scaling applies to the global layers only
        full = dict(flat.get("rope_scaling") or {"rope_type": "default"})
        full.setdefault("rope_theta", flat["rope_theta"])
        return full, float(flat["rope_local_base_freq"])
    if not isinstance(params, dict) or not set(params) <= {SLIDING, FULL}:
        raise ValueError(f"{path}: Gemma 3 'rope_parameters' must be keyed by {FULL!r} and {SLIDING!r}, got {params!r}")
    full = dict(params.get(FULL) or {"rope_type": "default"})
    full.setdefault("rope_theta", flat["rope_theta"])
    local = dict(params.get(SLIDING) or {"rope_type": "default"})
    local_type = local.get("rope_type", local.get("type", "default"))
    if local_type != "default":
        raise ValueError(f"{path}: Gemma 3 sliding-window layers with rope type {local_type!r} are not supported")
    return full, float(local.get("rope_theta", flat["rope_local_base_freq"]))


def gemma_fields(rules: GemmaRules, flat: dict[str, Any], num_layers: int, path: Path) -> dict[str, Any]:
    """ModelConfig fields a Gemma config sets beyond the Llama-like ones, from gemma_text_config's dict."""
    if flat.get("use_bidirectional_attention"):
        raise ValueError(f"{path}: use_bidirectional_attention (an encoder-style mask) is not supported")
    final_softcap = flat.get("final_logit_softcapping")
    return dict(
        attn_scale=_positive(flat, "query_pre_attn_scalar", path) ** -0.5,
        final_logit_softcap=0.0 if final_softcap is None else _positive(flat, "final_logit_softcapping", path),
        local_layers=_local_layers(rules, flat, num_layers, path),
        rope_local_theta=float(flat["rope_local_base_freq"]) if rules.local_rope else None,
    )


def _local_layers(rules: GemmaRules, flat: dict[str, Any], num_layers: int, path: Path) -> tuple[bool, ...]:
    """True where layer i is a sliding-window ("local") layer: `layer_types`, else the architecture's pattern."""
    types = flat.get("layer_types")
    if types is None:
        pattern = rules.fixed_pattern or int(flat.get("sliding_window_pattern", 6))
        return tuple(bool((i + 1) % pattern) for i in range(num_layers))
    if not isinstance(types, list) or len(types) != num_layers or not set(types) <= {SLIDING, FULL}:
        raise ValueError(
            f"{path}: 'layer_types' must list {FULL!r} or {SLIDING!r} for each of {num_layers} layers, got {types!r}"
        )
    return tuple(t == SLIDING for t in types)


def _positive(flat: dict[str, Any], key: str, path: Path) -> float:
    value = flat.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{path}: {key!r} must be a positive number, got {value!r}")
    return float(value)
