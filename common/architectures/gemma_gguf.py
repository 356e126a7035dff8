"""A Gemma 2 / Gemma 3 GGUF file as llama.cpp's convert_hf_to_gguf.py writes it, read back into
the config.json and tensor names the Gemma model code reads (no torch here).

Tensors (beyond the Llama names of gguf_names.GGUF_TO_HF):

    blk.N.post_attention_norm -> model.layers.N.post_attention_layernorm
    blk.N.ffn_norm            -> model.layers.N.pre_feedforward_layernorm   (not Llama's post-attention norm)
    blk.N.post_ffw_norm       -> model.layers.N.post_feedforward_layernorm

Every `*norm.weight` is stored as 1 + w (the converter adds 1, as GemmaRMSNorm multiplies by
1 + w); the reader subtracts 1 (`is_shifted_norm`). q/k rows are not permuted.

Metadata -> config.json, where a key is missing falling back as llama.cpp's loader does (GemmaRules):

    attention.sliding_window         gemma2: 4096; gemma3: none (every layer global)
    attention.sliding_window_pattern gemma2: 2, gemma3: 6 (every n-th layer global); an array: per layer
    attn_logit_softcapping           gemma2: 50.0 (gemma3 never applies it)
    final_logit_softcapping          gemma2: 30.0; gemma3: off
    rope.freq_base / _swa            10000 / gemma2: the global base, gemma3: 10000
    rope.scaling.type + factor       linear (llama.cpp's default type; "none" scales alike), factor 1;
                                     other types refused; gemma3: the global layers only
    query_pre_attn_scalar            not stored: llama.cpp takes head_dim, except for the 27B
                                     models (46 layers gemma2, 62 gemma3): hidden / heads
"""

from __future__ import annotations

from typing import Any

from zserve.common.architectures.gemma_rules import GemmaRules
from zserve.common.architectures.gguf_metadata import GgufMetadata
from zserve.common.architectures.gguf_names import GGUF_TO_HF

GEMMA_GGUF_TO_HF = {  # blk.N.<key> -> model.layers.N.<value>, over GGUF_TO_HF
    **GGUF_TO_HF,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORM_SHIFT = 1.0
_DEFAULT_ROPE_BASE = 10_000.0


def is_shifted_norm(hf_name: str) -> bool:
    """True for a tensor the converter stored as 1 + w."""
    return hf_name.endswith("norm.weight")


def gemma_config(rules: GemmaRules, meta: GgufMetadata) -> dict[str, Any]:
    """config.json for a Gemma GGUF whose metadata is `meta`; ValueError (one line naming the file)
    for a setting zserve cannot run."""
    arch, where = meta.architecture, meta.where
    embedding = meta.tensor_shapes.get("token_embd.weight")
    if embedding is None:
        raise ValueError(f"{where}: no token_embd.weight tensor")

    def scalar(key: str, default: Any = ...) -> Any:
        value = meta.get(key)
        if value is None and default is ...:
            raise ValueError(f"{where}: GGUF metadata lacks {arch}.{key}")
        value = default if value is None else value
        if isinstance(value, list):
            raise ValueError(f"{where}: per-layer {arch}.{key} ({value!r}) is not supported")
        return value

    hidden, num_heads, num_layers = int(scalar("embedding_length")), int(scalar("attention.head_count")), \
        int(scalar("block_count"))
    head_dim = int(scalar("attention.key_length", hidden // num_heads))
    for key in ("attention.value_length", "rope.dimension_count"):
        if int(scalar(key, head_dim)) != head_dim:
            raise ValueError(f"{where}: {arch}.{key}={scalar(key)} differs from the head size {head_dim}")
    config: dict[str, Any] = dict(
        architectures=[rules.hf_architecture], model_type=arch, vocab_size=int(embedding[-1]),
        hidden_size=hidden, intermediate_size=int(scalar("feed_forward_length")), num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=int(scalar("attention.head_count_kv", num_heads)),
        head_dim=head_dim, rms_norm_eps=float(scalar("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(scalar("context_length")), hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=not meta.has_output,
        query_pre_attn_scalar=hidden // num_heads if num_layers == rules.gguf_layers_of_27b else head_dim,
    )
    window = scalar("attention.sliding_window", rules.gguf_default_window)
    config["sliding_window"] = int(window) if window else None
    pattern = meta.get("attention.sliding_window_pattern", rules.gguf_default_pattern)
    config["layer_types"] = _layer_types(arch, pattern, num_layers, bool(window), where)
    if rules.gguf_attn_softcap is not None:
        config["attn_logit_softcapping"] = float(scalar("attn_logit_softcapping", rules.gguf_attn_softcap))
    final = float(scalar("final_logit_softcapping", rules.gguf_final_softcap))
    # an architecture that always caps keeps a stored 0 (refused later); one that caps when told reads 0 as off
    config["final_logit_softcapping"] = final if rules.gguf_final_softcap else final or None
    config.update(_rope(rules, arch, scalar, where))
    return config


def _layer_types(arch: str, pattern: Any, num_layers: int, windowed: bool, where: str) -> list[str]:
    """Per layer "sliding_attention" / "full_attention": every `pattern`-th layer global, or a bool per layer."""
    if not windowed:
        return ["full_attention"] * num_layers
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise ValueError(f"{where}: {arch}.attention.sliding_window_pattern lists {len(pattern)} layers, "
                             f"not {num_layers}")
        return ["sliding_attention" if p else "full_attention" for p in pattern]
    pattern = int(pattern)
    if pattern < 1:
        raise ValueError(f"{where}: {arch}.attention.sliding_window_pattern={pattern} must be positive")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]


def _rope(rules: GemmaRules, arch: str, scalar, where: str) -> dict[str, Any]:
    """The RoPE keys of config.json: Gemma 2 one base for all layers, Gemma 3 a global and a local one."""
    base = float(scalar("rope.freq_base", _DEFAULT_ROPE_BASE))
    scaling_type = str(scalar("rope.scaling.type", "linear"))  # llama.cpp's default; "none" scales alike
    factor = float(scalar("rope.scaling.factor", scalar("rope.scale_linear", 1.0)))
    if scaling_type not in ("none", "linear"):
        raise ValueError(f"{where}: {arch}.rope.scaling.type {scaling_type!r} is not supported for Gemma")
    full = {"rope_type": "linear", "factor": factor} if factor not in (0.0, 1.0) else {"rope_type": "default"}
    if not rules.local_rope:
        if float(scalar("rope.freq_base_swa", base)) != base:
            raise ValueError(f"{where}: {arch} with a local RoPE base ({arch}.rope.freq_base_swa) is not supported")
        return {"rope_parameters": {**full, "rope_theta": base}}
    local_base = float(scalar("rope.freq_base_swa", _DEFAULT_ROPE_BASE))
    return {"rope_parameters": {"full_attention": {**full, "rope_theta": base},
                                "sliding_attention": {"rope_type": "default", "rope_theta": local_base}}}
