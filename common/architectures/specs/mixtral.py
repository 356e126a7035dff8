"""Mixtral: Mistral attention; every layer sparse, experts as wide as `intermediate_size`, the top-k
always renormalised. Its GGUF is llama.cpp's `llama` with experts (specs/llama.py)."""

from zserve.common.architectures.arch_spec import ArchSpec, MoeKeys
from zserve.common.architectures.layer_windows import EVERY_LAYER_WINDOWS

SPEC = ArchSpec(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    model="mixtral",
    windows=EVERY_LAYER_WINDOWS,
    moe=MoeKeys(width_key="intermediate_size", always_norm_topk=True),
)
