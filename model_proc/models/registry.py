"""Model family (from ModelConfig.family) -> our model class."""

from __future__ import annotations

from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.models.gemma2 import Gemma2ForCausalLM
from zserve.model_proc.models.gemma3 import Gemma3ForCausalLM
from zserve.model_proc.models.gpt2 import GPT2LMHeadModel
from zserve.model_proc.models.llama import LlamaForCausalLM
from zserve.model_proc.models.moe import MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from zserve.model_proc.models.phi3 import Phi3ForCausalLM
from zserve.model_proc.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gpt2": GPT2LMHeadModel,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "qwen2_moe": Qwen2MoeForCausalLM,
    "mixtral": MixtralForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "phi3": Phi3ForCausalLM,
}


def build_model(cfg: ModelConfig, tp_rank: int = 0, tp_size: int = 1) -> nn.Module:
    """Uninitialised parameters (in the current default device and dtype); call `.load(ckpt)` next."""
    if cfg.family not in MODEL_CLASSES:
        have = ", ".join(MODEL_CLASSES)
        raise ValueError(f"no model code for family {cfg.family!r} ({cfg.architecture}); have {have}")
    return MODEL_CLASSES[cfg.family](cfg, tp_rank, tp_size)
