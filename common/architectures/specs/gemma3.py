"""Gemma 3 (and the text model of Gemma3ForConditionalGeneration; the vision tower is not loaded):
Gemma 2's layout plus (1 + w) q/k norms, a local RoPE base for the sliding layers, every
`sliding_window_pattern`-th layer global; its config has attn_logit_softcapping, but transformers'
Gemma 3 never applies it."""

from functools import partial

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec, WindowRule
from zserve.common.architectures.gemma_gguf import GEMMA_GGUF_TO_HF, gemma_config
from zserve.common.architectures.gemma_rules import SHARED_DEFAULTS, GemmaRules
from zserve.common.architectures.gemma_text import gemma_fields, gemma_text_config
from zserve.common.architectures.layer_windows import pattern_default_type

GEMMA3 = GemmaRules(
    hf_architecture="Gemma3ForCausalLM",
    defaults=dict(SHARED_DEFAULTS, vocab_size=262_208, max_position_embeddings=131_072, rope_theta=1_000_000.0,
                  rope_local_base_freq=10_000.0, sliding_window_pattern=6, final_logit_softcapping=None,
                  attn_logit_softcapping=None),  # transformers' Gemma3TextConfig
    fixed_pattern=None,
    local_rope=True,
    gguf_default_window=None,
    gguf_default_pattern=6,
    gguf_layers_of_27b=62,
    gguf_attn_softcap=None,
    gguf_final_softcap=0.0,
)

SPEC = ArchSpec(
    name="gemma3",
    hf_architectures=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    model="gemma3",
    text_config=partial(gemma_text_config, GEMMA3),
    qk_norm=True,
    windows=WindowRule(default_type=pattern_default_type),
    extra_fields=partial(gemma_fields, GEMMA3),
    gguf=GgufSpec(
        name="gemma3", block_names=GEMMA_GGUF_TO_HF, shifted_norms=True, config=partial(gemma_config, GEMMA3)
    ),
)
