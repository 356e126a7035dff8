"""Qwen3-MoE: Qwen3 attention; sparse layers of `moe_intermediate_size` experts."""

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec, MoeKeys, WindowRule
from zserve.common.architectures.gguf_experts import qwen_moe_keys

SPEC = ArchSpec(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    model="qwen3_moe",
    head_dim_default=128,  # transformers' Qwen3MoeConfig default
    qk_norm=True,
    windows=WindowRule(every_layer=True, needs_use_flag=True),
    moe=MoeKeys(width_key="moe_intermediate_size"),
    gguf=GgufSpec(name="qwen3moe", moe_keys=qwen_moe_keys),
)
