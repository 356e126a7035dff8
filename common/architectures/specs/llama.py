"""Llama 2/3, SmolLM2 (and Mixtral's GGUF: llama.cpp writes it as `llama` with experts)."""

from zserve.common.architectures.arch_spec import ArchSpec, GgufSpec
from zserve.common.architectures.gguf_experts import mixtral_moe_keys

SPEC = ArchSpec(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    model="llama",
    gguf=GgufSpec(name="llama", permuted_qk=True, moe_keys=mixtral_moe_keys),
)
