"""A mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral): router, routed experts, shared expert.

    ids, w  = router(x)                               [T, k] each
    y       = experts(x, ids, w)                      fused_experts.py: one GEMM pair per expert hit
    y      += sigmoid(x @ g^T) * shared_expert(x)     Qwen2-MoE only
    return all_reduce(y)                              one all-reduce per layer under tensor parallelism
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zserve.common.moe_config import MoeConfig
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.fused_experts import ExpertMLP, FusedExperts
from zserve.model_proc.layers.parallel import all_reduce
from zserve.model_proc.layers.router import TopKRouter


@dataclass(frozen=True, slots=True)
class MoeNames:
    """Where a family's checkpoint keeps a sparse layer's tensors, under `model.layers.{i}`."""

    block: str = "mlp"  # Mixtral: "block_sparse_moe"
    projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # Mixtral: w1, w3, w2
    round_weights: bool = True  # the router rounds its weights to the compute dtype (Mixtral: no)


class SparseMoeBlock(nn.Module):
    def __init__(
        self, moe: MoeConfig, hidden_size: int, hidden_act: str, names: MoeNames, tp_rank: int, tp_size: int
    ):
        super().__init__()
        self.names, self.tp_size = names, tp_size
        self.gate = TopKRouter(
            hidden_size, moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob, names.round_weights
        )
        self.experts = FusedExperts(
            moe.num_experts, hidden_size, moe.expert_intermediate_size, hidden_act, tp_rank, tp_size
        )
        self.shared_expert: ExpertMLP | None = None
        self.shared_expert_gate: nn.Parameter | None = None
        if moe.has_shared_expert:
            shared_size = moe.shared_expert_intermediate_size
            self.shared_expert = ExpertMLP(hidden_size, shared_size, hidden_act, tp_rank, tp_size)
            self.shared_expert_gate = nn.Parameter(torch.empty(1, hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert_ids, weights = self.gate(x)
        y = self.experts(x, expert_ids, weights)  # [T, hidden], this rank's partial sum
        if self.shared_expert is not None:
            y += torch.sigmoid(F.linear(x, self.shared_expert_gate)) * self.shared_expert(x)
        return all_reduce(y, self.tp_size)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        """`prefix`: the layer's MLP name, `model.layers.{i}.mlp` (the block's own name replaces `mlp`)."""
        block = f"{prefix.removesuffix('.mlp')}.{self.names.block}"
        self.gate.load(ckpt, f"{block}.gate.weight")
        self.experts.load(ckpt, f"{block}.experts", self.names.projections)
        if self.shared_expert is not None:
            self.shared_expert.load(ckpt, f"{block}.shared_expert", ("gate_proj", "up_proj", "down_proj"))
            name = f"{block}.shared_expert_gate.weight"
            ckpt.copy_into(self.shared_expert_gate, ckpt.read(name, (1, self.shared_expert_gate.shape[1])), name)
