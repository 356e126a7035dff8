"""Mixture-of-experts families on the Llama layout: the MLP of a sparse layer is a SparseMoeBlock.

    Qwen3MoeForCausalLM   Qwen3 attention (q/k norms); experts under `mlp.experts.{e}`; dense layers
                          where mlp_only_layers / decoder_sparse_step say
    Qwen2MoeForCausalLM   Qwen2 attention (q/k/v bias); plus a sigmoid-gated shared expert
    MixtralForCausalLM    Mistral attention; experts under `block_sparse_moe.experts.{e}.w1/w3/w2`,
                          fp32 routing weights, always renormalised
"""

from __future__ import annotations

from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.layers.sparse_moe import MoeNames, SparseMoeBlock
from zserve.model_proc.models.llama import LlamaForCausalLM
from zserve.model_proc.models.qwen3 import Qwen3Attention


class MoeLlamaForCausalLM(LlamaForCausalLM):
    names = MoeNames()

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int) -> nn.Module | None:
        assert cfg.moe is not None, f"{cfg.architecture} has no MoE settings"
        if not cfg.moe.is_sparse_layer(layer_idx):
            return None
        return SparseMoeBlock(cfg.moe, cfg.hidden_size, cfg.hidden_act, self.names, tp_rank, tp_size)


class Qwen3MoeForCausalLM(MoeLlamaForCausalLM):
    family = "qwen3_moe"
    attention_cls = Qwen3Attention


class Qwen2MoeForCausalLM(MoeLlamaForCausalLM):
    family = "qwen2_moe"


class MixtralForCausalLM(MoeLlamaForCausalLM):
    family = "mixtral"
    names = MoeNames(block="block_sparse_moe", projections=("w1", "w3", "w2"), round_weights=False)
