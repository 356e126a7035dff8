"""Mistral (dense): Llama with a sliding window on every layer. llama.cpp writes its GGUF as `llama`."""

from zserve.common.architectures.arch_spec import ArchSpec
from zserve.common.architectures.layer_windows import EVERY_LAYER_WINDOWS

SPEC = ArchSpec(name="mistral", hf_architectures=("MistralForCausalLM",), model="llama", windows=EVERY_LAYER_WINDOWS)
