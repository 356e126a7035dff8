"""Qwen2-MoE: Qwen2 attention (q/k/v bias as `qkv_bias` says, default on); sparse layers plus a
sigmoid-gated shared expert."""

from zserve.common.architectures.arch_spec import ArchSpec, BiasRule, MoeKeys

SPEC = ArchSpec(
    name="qwen2_moe",
    hf_architectures=("Qwen2MoeForCausalLM",),
    model="qwen2_moe",
    qkv_bias=BiasRule(key="qkv_bias", default=True),
    o_bias=BiasRule(key=None, default=False),
    moe=MoeKeys(width_key="moe_intermediate_size", shared_expert=True),
)
