"""A mixture-of-experts router: which `top_k` experts each token takes, and with what weight.

As transformers does it (Qwen3-MoE, Qwen2-MoE, Mixtral): logits = x @ W_router^T in x's dtype;
softmax in fp32; top-k; divided by their sum when `norm_topk_prob` (Mixtral: always). Qwen's
routers round the weights to x's dtype; Mixtral's keep them in fp32 (`round_weights`). The router
stays in the compute dtype under --quantization (it is small, and routing is where rounding hurts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint


class TopKRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int, norm_topk_prob: bool, round_weights: bool):
        super().__init__()
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.norm_topk_prob, self.round_weights = norm_topk_prob, round_weights
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)  # [E, hidden]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (expert_ids int64 [T, k], weights [T, k] fp32 or x's dtype)."""
        # x @ W^T summed in fp32 and rounded once to x's dtype, as torch's bf16 matmul does; a bf16
        # [T, hidden] x [hidden, E] mm itself takes torch's slow path on a CPU (4 ms at hidden 1024, E 8)
        logits = F.linear(x.float(), self.weight.float()).to(x.dtype)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return expert_ids, weights.to(x.dtype) if self.round_weights else weights

    def load(self, ckpt: Checkpoint, name: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(name, (self.num_experts, self.hidden_size)), name)
