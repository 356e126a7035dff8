"""Gemma 2: (1 + w) RMSNorms around attention and MLP, a softmax scale from query_pre_attn_scalar,
attention and final logit soft-capping, every other layer local (common/architectures/gemma_text.py)."""

from functools import partial

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec, WindowRule
from zserve.common.architectures.gemma_gguf import GEMMA_GGUF_TO_HF, gemma_config
from zserve.common.architectures.gemma_rules import SHARED_DEFAULTS, GemmaRules
from zserve.common.architectures.gemma_text import gemma_fields, gemma_text_config
from zserve.common.architectures.layer_windows import alternate_default_type

GEMMA2 = GemmaRules(
    hf_architecture="Gemma2ForCausalLM",
    defaults=dict(SHARED_DEFAULTS, vocab_size=256000, max_position_embeddings=8192, rope_theta=10_000.0,
                  final_logit_softcapping=30.0, attn_logit_softcapping=50.0),  # transformers' Gemma2Config
    fixed_pattern=2,
    local_rope=False,
    gguf_default_window=4096,
    gguf_default_pattern=2,
    gguf_layers_of_27b=46,
    gguf_attn_softcap=50.0,
    gguf_final_softcap=30.0,
)

SPEC = ArchSpec(
    name="gemma2",
    hf_architectures=("Gemma2ForCausalLM",),
    model="gemma2",
    text_config=partial(gemma_text_config, GEMMA2),
    windows=WindowRule(default_type=alternate_default_type),
    reads_attn_softcap=True,
    extra_fields=partial(gemma_fields, GEMMA2),
    gguf=GgufSpec(
        name="gemma2", block_names=GEMMA_GGUF_TO_HF, shifted_norms=True, config=partial(gemma_config, GEMMA2)
    ),
)
