"""GPT-2: learned positions, LayerNorm, an ungated MLP, biases everywhere, its own config.json keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zserve.common.architectures.arch_spec import ArchSpec
from zserve.common.architectures.config_field import config_field


def gpt2_fields(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    def get(*keys: str, default: Any = ..., kind: type = int) -> Any:
        return config_field(raw, path, keys, default, kind)

    hidden = get("n_embd", "hidden_size")
    num_heads = get("n_head", "num_attention_heads")
    head_dim = hidden // num_heads
    return dict(
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_heads,
        intermediate_size=get("n_inner", default=4 * hidden),
        num_layers=get("n_layer", "num_hidden_layers"),
        context_len=get("n_positions", "max_position_embeddings"),
        norm_eps=get("layer_norm_epsilon", default=1e-5, kind=float),
        hidden_act=get("activation_function", default="gelu_new", kind=str),
        head_dim=head_dim,
        tie_word_embeddings=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        qk_norm=False,
        rope_theta=None,
        rope_scaling=None,
        partial_rotary_factor=1.0,
        attn_scale=head_dim**-0.5 if raw.get("scale_attn_weights", True) else 1.0,
        attn_scale_by_layer=bool(raw.get("scale_attn_by_inverse_layer_idx", False)),
    )


SPEC = ArchSpec(
    name="gpt2", hf_architectures=("GPT2LMHeadModel",), model="gpt2", core_fields=gpt2_fields, gated_mlp=False
)
