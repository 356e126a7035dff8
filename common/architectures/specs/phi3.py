"""Phi-3 / Phi-4-mini: the Llama layout with q/k/v and gate/up fused on disk, "longrope" RoPE (old
names "su" / "yarn"), a partial rotary (Phi-4-mini), a sliding window on every layer."""

from __future__ import annotations

from typing import Any

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec, RopeQuirks
from zserve.common.architectures.gguf_metadata import GgufMetadata
from zserve.common.architectures.gguf_names import GGUF_TO_HF
from zserve.common.architectures.layer_windows import EVERY_LAYER_WINDOWS

# llama.cpp's converter: q/k/v fused, and ffn_up holds gate and up stacked (gate first)
PHI3_TO_HF = {**GGUF_TO_HF, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}


def phi3_rope_keys(meta: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """What transformers' GGUF config reader leaves out for phi3: the partial rotary (from
    rope.dimension_count), the original context and the longrope factors (stored as tensors)."""
    rope_parameters = config.get("rope_parameters") or {}
    partial = config.get("partial_rotary_factor") or rope_parameters.get("partial_rotary_factor", 1.0)
    if meta.get("rope.dimension_count") is not None:
        partial = int(meta.get("rope.dimension_count")) / (config["hidden_size"] // config["num_attention_heads"])
    original = meta.get("rope.scaling.original_context_length")
    original = int(original) if original else config["max_position_embeddings"]
    rope = {"rope_type": "default", "rope_theta": rope_parameters.get("rope_theta", 10000.0),
            "partial_rotary_factor": partial}
    if meta.rope_factors:
        rope.update(rope_type="longrope", original_max_position_embeddings=original,
                    long_factor=meta.rope_factors["rope_factors_long.weight"],
                    short_factor=meta.rope_factors["rope_factors_short.weight"])
    return {"partial_rotary_factor": partial, "original_max_position_embeddings": original, "rope_parameters": rope}


SPEC = ArchSpec(
    name="phi3",
    hf_architectures=("Phi3ForCausalLM",),
    model="phi3",
    rope=RopeQuirks(type_aliases=(("su", "longrope"), ("yarn", "longrope")), original_max_len_default=4096),
    windows=EVERY_LAYER_WINDOWS,
    gguf=GgufSpec(name="phi3", block_names=PHI3_TO_HF, patch=phi3_rope_keys),
)
