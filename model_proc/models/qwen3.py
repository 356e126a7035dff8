"""Qwen3: the Llama layout plus an RMSNorm over head_dim on every q and k head, before RoPE."""

from __future__ import annotations

import torch
from torch import nn

from zserve.common.model_config import ModelConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.norm import RMSNorm
from zserve.model_proc.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    qk_norm_cls: type[nn.Module] = RMSNorm  # Gemma 3 normalises q and k with its (1 + w) norm

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int):
        super().__init__(cfg, layer_idx, tp_rank, tp_size)
        self.q_norm = self.qk_norm_cls(cfg.head_dim, cfg.norm_eps)
        self.k_norm = self.qk_norm_cls(cfg.head_dim, cfg.norm_eps)

    def norm_qk(self, qk: torch.Tensor) -> torch.Tensor:
        h = self.num_heads  # qk [T, h + kvh, d]
        return torch.cat((self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])), dim=1)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        super().load(ckpt, prefix)
        self.q_norm.load(ckpt, f"{prefix}.q_norm.weight")
        self.k_norm.load(ckpt, f"{prefix}.k_norm.weight")


class Qwen3ForCausalLM(LlamaForCausalLM):
    family = "qwen3"
    attention_cls = Qwen3Attention
