"""Qwen2: Llama with a q/k/v bias (always, whatever attention_bias says) and no o bias."""

from zserve.common.architectures.arch_spec import ArchSpec, BiasRule, GgufSpec
from zserve.common.architectures.layer_windows import QWEN_WINDOWS

SPEC = ArchSpec(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    model="llama",
    qkv_bias=BiasRule(key=None, default=True),
    o_bias=BiasRule(key=None, default=False),
    windows=QWEN_WINDOWS,
    gguf=GgufSpec(name="qwen2"),
)
