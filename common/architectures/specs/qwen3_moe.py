"""Qwen3-MoE: Qwen3's attention (its spec: q/k norms, head_dim 128 when config.json leaves it out);
sparse layers of `moe_intermediate_size` experts; a window on every layer when `use_sliding_window`."""

from dataclasses import replace

from zserve.common.architectures.arch_spec import GgufSpec, MoeKeys, WindowRule
from zserve.common.architectures.gguf_experts import qwen_moe_keys
from zserve.common.architectures.specs import qwen3

SPEC = replace(
    qwen3.SPEC,
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    model="qwen3_moe",
    windows=WindowRule(every_layer=True, needs_use_flag=True),
    moe=MoeKeys(width_key="moe_intermediate_size"),
    gguf=GgufSpec(name="qwen3moe", moe_keys=qwen_moe_keys),
)
