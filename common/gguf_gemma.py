"""A Gemma 2 / Gemma 3 GGUF file as llama.cpp's convert_hf_to_gguf.py writes it, read back into
the config.json and tensor names the Gemma model code reads (no torch here).

Tensors (beyond the Llama names of gguf_checkpoint.GGUF_TO_HF):

    blk.N.post_attention_norm -> model.layers.N.post_attention_layernorm
    blk.N.ffn_norm            -> model.layers.N.pre_feedforward_layernorm   (not Llama's post-attention norm)
    blk.N.post_ffw_norm       -> model.layers.N.post_feedforward_layernorm

Every `*norm.weight` is stored as 1 + w (the converter adds 1, as GemmaRMSNorm multiplies by
1 + w); the reader subtracts 1 (`is_shifted_norm`). q/k rows are not permuted.

Metadata -> config.json, where a key is missing falling back as llama.cpp's loader does:

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

GEMMA_GGUF_ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
GEMMA_GGUF_TO_HF = {  # blk.N.<key> -> model.layers.N.<value>, over gguf_checkpoint.GGUF_TO_HF
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORM_SHIFT = 1.0
_DEFAULT_WINDOW = {"gemma2": 4096, "gemma3": None}
_DEFAULT_PATTERN = {"gemma2": 2, "gemma3": 6}
_LAYERS_OF_27B = {"gemma2": 46, "gemma3": 62}
_DEFAULT_ROPE_BASE = 10_000.0


def is_shifted_norm(hf_name: str) -> bool:
    """True for a tensor the converter stored as 1 + w."""
    return hf_name.endswith("norm.weight")


def gemma_config(arch: str, fields: dict[str, Any], has_output: bool, vocab_size: int, where: str) -> dict[str, Any]:
    """config.json for a `arch` ("gemma2" / "gemma3") GGUF whose metadata is `fields` (key -> value);
    ValueError (one line naming `where`) for a setting zserve cannot run."""

    def get(key: str, default: Any = ...) -> Any:
        value = fields.get(f"{arch}.{key}")
        if value is None and default is ...:
            raise ValueError(f"{where}: GGUF metadata lacks {arch}.{key}")
        return default if value is None else value

    def scalar(key: str, default: Any = ...) -> Any:
        value = get(key, default)
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
        architectures=[GEMMA_GGUF_ARCHITECTURES[arch]], model_type=arch, vocab_size=vocab_size,
        hidden_size=hidden, intermediate_size=int(scalar("feed_forward_length")), num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=int(scalar("attention.head_count_kv", num_heads)),
        head_dim=head_dim, rms_norm_eps=float(scalar("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(scalar("context_length")), hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=not has_output,
        query_pre_attn_scalar=hidden // num_heads if num_layers == _LAYERS_OF_27B[arch] else head_dim,
    )
    window = scalar("attention.sliding_window", _DEFAULT_WINDOW[arch])
    config["sliding_window"] = int(window) if window else None
    config["layer_types"] = _layer_types(arch, get("attention.sliding_window_pattern", _DEFAULT_PATTERN[arch]),
                                         num_layers, bool(window), where)
    if arch == "gemma2":
        config["attn_logit_softcapping"] = float(scalar("attn_logit_softcapping", 50.0))
        config["final_logit_softcapping"] = float(scalar("final_logit_softcapping", 30.0))
    else:
        final = float(scalar("final_logit_softcapping", 0.0))
        config["final_logit_softcapping"] = final or None
    config.update(_rope(arch, scalar, where))
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


def _rope(arch: str, scalar, where: str) -> dict[str, Any]:
    """The RoPE keys of config.json: Gemma 2 one base for all layers, Gemma 3 a global and a local one."""
    base = float(scalar("rope.freq_base", _DEFAULT_ROPE_BASE))
    scaling_type = str(scalar("rope.scaling.type", "linear"))  # llama.cpp's default; "none" scales alike
    factor = float(scalar("rope.scaling.factor", scalar("rope.scale_linear", 1.0)))
    if scaling_type not in ("none", "linear"):
        raise ValueError(f"{where}: {arch}.rope.scaling.type {scaling_type!r} is not supported for Gemma")
    full = {"rope_type": "linear", "factor": factor} if factor not in (0.0, 1.0) else {"rope_type": "default"}
    if arch == "gemma2":
        if float(scalar("rope.freq_base_swa", base)) != base:
            raise ValueError(f"{where}: gemma2 with a local RoPE base ({arch}.rope.freq_base_swa) is not supported")
        return {"rope_parameters": {**full, "rope_theta": base}}
    local_base = float(scalar("rope.freq_base_swa", _DEFAULT_ROPE_BASE))
    return {"rope_parameters": {"full_attention": {**full, "rope_theta": base},
                                "sliding_attention": {"rope_type": "default", "rope_theta": local_base}}}
