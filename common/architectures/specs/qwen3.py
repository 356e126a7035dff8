"""Qwen3: Llama plus an RMSNorm on q and k; head_dim 128 when config.json leaves it out."""

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec
from zserve.common.architectures.layer_windows import QWEN_WINDOWS

SPEC = ArchSpec(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    model="qwen3",
    head_dim_default=128,  # transformers' Qwen3Config default
    qk_norm=True,
    windows=QWEN_WINDOWS,
    gguf=GgufSpec(name="qwen3"),
)
