"""Phi-3 / Phi-4-mini: the Llama layout with q/k/v fused into one `qkv_proj` and gate/up into one
`gate_up_proj` on disk (each split per tensor-parallel rank by ColumnParallelLinear.load), and
"longrope" RoPE scaling and a partial rotary (Phi-4-mini) from the config (rotary.py)."""

from __future__ import annotations

from zserve.common.model_config import ModelConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP


class Phi3Attention(LlamaAttention):
    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.qkv_proj.load(ckpt, [f"{prefix}.qkv_proj"])  # rows [q | k | v]
        self.o_proj.load(ckpt, f"{prefix}.o_proj")


class Phi3MLP(LlamaMLP):
    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        self.gate_up_proj.load(ckpt, [f"{prefix}.gate_up_proj"])  # rows [gate | up]
        self.down_proj.load(ckpt, f"{prefix}.down_proj")


class Phi3ForCausalLM(LlamaForCausalLM):
    family = "phi3"
    attention_cls = Phi3Attention

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, tp_rank: int, tp_size: int) -> Phi3MLP:
        return Phi3MLP(cfg, tp_rank, tp_size)
