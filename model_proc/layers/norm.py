"""RMSNorm (Llama, Qwen) and LayerNorm (GPT-2), replicated on every rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_proc.checkpoint import Checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one call (torch accumulates in fp32 for bf16/fp16 inputs); fewer ops matter at decode
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)

    def load(self, ckpt: Checkpoint, name: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(name, (self.dim,)), name)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(f"{prefix}.weight", (self.dim,)), f"{prefix}.weight")
        ckpt.copy_into(self.bias, ckpt.read(f"{prefix}.bias", (self.dim,)), f"{prefix}.bias")
