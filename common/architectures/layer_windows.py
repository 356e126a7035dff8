"""Which layers of a checkpoint attend through a sliding window, read from config.json as
transformers reads it for each architecture (a window W: position p sees keys p - W + 1 .. p).
Each spec's `windows` (a WindowRule) says which reading:

    Mistral, Mixtral, Phi-3     every layer, when `sliding_window` is set (transformers ignores
                                `layer_types` for these)
    Qwen3-MoE                   every layer, when `use_sliding_window` is true
    Qwen2, Qwen3                `layer_types`, else layers i >= `max_window_layers` (default 28);
                                only when `use_sliding_window` is true      (qwen_default_type)
    Gemma 2                     `layer_types`, else the even layers (0, 2, ...)   (alternate_default_type)
    Gemma 3                     `layer_types`, else all but every `sliding_window_pattern`-th
                                (default 6: layers 5, 11, ... are global)   (pattern_default_type)
    others (Llama, GPT-2)       none (`windows` None): their transformers code has no window

A `layer_types` entry other than "sliding_attention" / "full_attention" is refused: that is an
attention variant zserve has no code for (chunked, linear, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zserve.common.architectures.arch_spec import WindowRule

LAYER_TYPES = ("sliding_attention", "full_attention")
QWEN_MAX_WINDOW_LAYERS = 28  # transformers' Qwen2Config / Qwen3Config default
GEMMA3_PATTERN = 6  # transformers' Gemma3TextConfig default sliding_window_pattern


def layer_windows(
    rule: WindowRule | None, raw: dict[str, Any], num_layers: int, path: str | Path = "config.json"
) -> tuple[int, ...]:
    """One window per layer (0: full causal attention) under `rule` for config.json `raw` (for a
    multimodal Gemma 3, its text_config). Raises ValueError naming `path` for a value zserve cannot run."""
    if rule is None:
        return (0,) * num_layers
    window = raw.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{path}: 'sliding_window' must be a positive integer or null, got {window!r}")
    if rule.needs_use_flag and not raw.get("use_sliding_window", False):
        window = None  # transformers: sliding_window = sliding_window if use_sliding_window else None
    if window is None:
        return (0,) * num_layers
    if raw.get("use_bidirectional_attention"):
        raise ValueError(f"{path}: use_bidirectional_attention is not supported (zserve attends causally)")
    if rule.every_layer:
        return (window,) * num_layers
    types = raw.get("layer_types")
    if types is None:
        assert rule.default_type is not None, "a per-layer window rule needs a default_type"
        types = [rule.default_type(raw, i, Path(path)) for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(f"{path}: 'layer_types' must list one type per layer ({num_layers}), got {types!r}")
    for layer_type in types:
        if layer_type not in LAYER_TYPES:
            raise ValueError(
                f"{path}: layer type {layer_type!r} is not supported; supported: {', '.join(LAYER_TYPES)}"
            )
    return tuple(window if layer_type == "sliding_attention" else 0 for layer_type in types)


def qwen_default_type(raw: dict[str, Any], layer_idx: int, path: Path) -> str:
    """Qwen2 / Qwen3 without `layer_types`: layers from `max_window_layers` on slide."""
    first_sliding = raw.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
    return "sliding_attention" if layer_idx >= first_sliding else "full_attention"


def alternate_default_type(raw: dict[str, Any], layer_idx: int, path: Path) -> str:
    """Gemma 2 without `layer_types`: the even layers slide."""
    return "sliding_attention" if (layer_idx + 1) % 2 else "full_attention"


def pattern_default_type(raw: dict[str, Any], layer_idx: int, path: Path) -> str:
    """Gemma 3 without `layer_types`: every `sliding_window_pattern`-th layer is global."""
    pattern = raw.get("sliding_window_pattern", GEMMA3_PATTERN)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"{path}: 'sliding_window_pattern' must be a positive integer, got {pattern!r}")
    return "sliding_attention" if (layer_idx + 1) % pattern else "full_attention"


QWEN_WINDOWS = WindowRule(needs_use_flag=True, default_type=qwen_default_type)
EVERY_LAYER_WINDOWS = WindowRule(every_layer=True)
