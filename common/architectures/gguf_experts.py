"""config.json's mixture-of-experts keys from a GGUF file's metadata (a GgufSpec's `moe_keys`)."""

from __future__ import annotations

from typing import Any

from zserve.common.architectures.gguf_metadata import GgufMetadata


def qwen_moe_keys(meta: GgufMetadata) -> dict[str, Any]:
    """Qwen3-MoE: the expert width is `expert_feed_forward_length`; llama.cpp renormalises the top-k;
    layers without stacked experts are dense."""
    sparse = {int(name.split(".")[1]) for name in meta.tensor_shapes if ".ffn_gate_exps." in name}
    dense = sorted(set(range(meta.int_field("block_count"))) - sparse)
    return {"num_experts": meta.int_field("expert_count"), "num_experts_per_tok": meta.int_field("expert_used_count"),
            "norm_topk_prob": True, "moe_intermediate_size": meta.int_field("expert_feed_forward_length"),
            "decoder_sparse_step": 1, "mlp_only_layers": dense}


def mixtral_moe_keys(meta: GgufMetadata) -> dict[str, Any]:
    """Mixtral (llama.cpp's `llama` with experts): every layer sparse, the experts as wide as
    feed_forward_length, no sliding window, as Mixtral's own config.json says (transformers reads a
    llama file named "mistral" as MistralConfig, whose default window is 4096)."""
    width = meta.int_field("expert_feed_forward_length") or meta.int_field("feed_forward_length")
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": meta.int_field("expert_count"),
            "num_experts_per_tok": meta.int_field("expert_used_count"), "intermediate_size": width,
            "sliding_window": None}
