"""Architecture features that zserve has no model code for: refused at start, in one line, never approximated.

The architecture name alone does not say everything a checkpoint needs: a config.json of an
architecture we implement can switch on a feature our code lacks (a multimodal RoPE, bidirectional
attention, cross-attention, an activation). Serving it anyway would give fluent wrong text, so the
launcher refuses it before any child starts (exit 2), as it refuses an unknown architecture.
Features that the model code of an architecture reads itself (rope types, sliding windows, MoE
routing) are refused where they are parsed, in model_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# config.json activation names the model code implements; model_proc/layers/activation.py holds the
# functions (a test checks the two agree)
GATED_ACTIVATION_NAMES = ("silu", "swish", "gelu_pytorch_tanh")
PLAIN_ACTIVATION_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu")


def _rope_keys(raw: dict[str, Any]) -> set[str]:
    """The keys of the RoPE settings in both spellings (`rope_parameters`, older `rope_scaling`)."""
    return {key for name in ("rope_parameters", "rope_scaling") if isinstance(raw.get(name), dict) for key in raw[name]}


def _true(raw: dict[str, Any], key: str) -> bool:
    return bool(raw.get(key))


# (what the feature is, test on config.json); checked for every architecture
FEATURES: tuple[tuple[str, Any], ...] = (
    ("multimodal RoPE ('mrope_section')", lambda raw: "mrope_section" in _rope_keys(raw)),
    ("bidirectional attention ('use_bidirectional_attention')", lambda raw: _true(raw, "use_bidirectional_attention")),
    ("cross-attention ('add_cross_attention')", lambda raw: _true(raw, "add_cross_attention")),
)


def feature_refusal(raw: dict[str, Any], arch: str, gated_mlp: bool, path: Path) -> str | None:
    """The one-line refusal of a config.json switching on a feature zserve does not implement, or None.
    `gated_mlp`: the architecture's MLP is gated (gate * act(up)), which decides the activation table."""
    for feature, present in FEATURES:
        if present(raw):
            return f"{path}: {arch} with {feature} is not supported: zserve has no model code for it"
    act_key = "hidden_act" if "hidden_act" in raw or gated_mlp else "activation_function"
    act = raw.get(act_key, raw.get("hidden_activation"))
    names = GATED_ACTIVATION_NAMES if gated_mlp else PLAIN_ACTIVATION_NAMES
    if act is not None and act not in names:
        return f"{path}: {arch} with activation {act!r} is not supported; supported: {', '.join(names)}"
    return None
