"""The Llama-shaped reading of config.json every spec but GPT-2 shares: sizes, norms, biases, RoPE,
with the spec's rules (head_dim default, biases, q/k norm, RoPE quirks) where architectures differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zserve.common.architectures.arch_spec import ArchSpec
from zserve.common.architectures.config_field import config_field
from zserve.common.architectures.rope_config import extended_len, partial_rotary_factor, rope_config


def decoder_fields(spec: ArchSpec, raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """ModelConfig fields of a Llama-shaped decoder (`raw` already flattened by the spec's text_config)."""

    def get(*keys: str, default: Any = ..., kind: type = int) -> Any:
        return config_field(raw, path, keys, default, kind)

    hidden = get("hidden_size")
    num_heads = get("num_attention_heads")
    head_dim = get("head_dim", default=spec.head_dim_default or hidden // num_heads)
    context_len = get("max_position_embeddings")
    rope_theta, rope_scaling = rope_config(raw, path, spec.rope)
    if rope_scaling is not None and rope_scaling.rope_type in ("yarn", "dynamic"):
        # as vLLM: these scale the context past the maximum they were trained at
        context_len = max(context_len, int(extended_len(rope_scaling)))
    return dict(
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=get("num_key_value_heads", default=num_heads),
        intermediate_size=get("intermediate_size"),
        num_layers=get("num_hidden_layers"),
        context_len=context_len,
        norm_eps=get("rms_norm_eps", default=1e-6, kind=float),
        hidden_act=get("hidden_act", default="silu", kind=str),
        head_dim=head_dim,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=spec.qkv_bias.read(raw),
        o_bias=spec.o_bias.read(raw),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=spec.qk_norm,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        partial_rotary_factor=partial_rotary_factor(raw, path, head_dim),
        attn_scale=head_dim**-0.5,
        attn_scale_by_layer=False,
    )
