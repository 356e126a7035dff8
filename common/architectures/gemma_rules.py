"""What tells Gemma 2 from Gemma 3 in a config.json and in a GGUF file (one record each, in
specs/gemma2.py and specs/gemma3.py; gemma_text.py and gemma_gguf.py read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GemmaRules:
    hf_architecture: str  # what a GGUF file's config.json names
    defaults: dict[str, Any]  # transformers' config class defaults, for keys a config.json leaves out
    fixed_pattern: int | None  # every n-th layer global whatever config.json says (Gemma 2: 2); None: its key
    local_rope: bool  # the local layers have their own RoPE base (Gemma 3: rope_local_base_freq)
    # GGUF metadata left out, as llama.cpp's loader falls back
    gguf_default_window: int | None
    gguf_default_pattern: int
    gguf_layers_of_27b: int  # the 27B model: query_pre_attn_scalar = hidden / heads, not head_dim
    gguf_attn_softcap: float | None  # attn_logit_softcapping's default; None: never applied, not written
    gguf_final_softcap: float  # final_logit_softcapping's default; 0: capped only when the file says (0: off)


# transformers' Gemma2Config / Gemma3TextConfig defaults (5.x) the two share
SHARED_DEFAULTS: dict[str, Any] = dict(
    hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
    head_dim=256, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, eos_token_id=1, bos_token_id=2,
    tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
)
