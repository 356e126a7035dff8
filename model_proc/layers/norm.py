"""RMSNorm (Llama, Qwen), GemmaRMSNorm and LayerNorm (GPT-2), replicated on every rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.fused = False  # use_cpu_kernels(): one zserve:: call (kernels/fused_ops.cpp) instead of torch's ops

    def use_cpu_kernels(self) -> None:
        self.fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers' order: x / rms(x) in fp32 (F.rms_norm upcasts bf16/fp16), rounded to x's
        # dtype, then times the weight in that dtype. Fusing the weight into F.rms_norm rounds
        # once instead, which moves ~1/4 of bf16 outputs by one ulp. The fused op keeps the order.
        if self.fused and x.dim() == 2:
            return torch.ops.zserve.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (self.dim,), None, self.eps) * self.weight

    def add_norm(self, delta: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """x += delta (in place, rounded to x's dtype), then the norm of x; `delta` None: the norm."""
        if delta is None:
            return self(x)
        if self.fused:
            return torch.ops.zserve.add_rms_norm_(delta, x, self.weight, self.eps)
        return self(x.add_(delta))

    def load(self, ckpt: Checkpoint, name: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(name, (self.dim,)), name)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), all in fp32, rounded to x's dtype once at the
    end (Llama rounds before the weight). The checkpoint stores `weight`, not 1 + weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # transformers' formula, op for op
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)

    def load(self, ckpt: Checkpoint, name: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(name, (self.dim,)), name)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics for bf16 x, as nn.LayerNorm
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)

    def load(self, ckpt: Checkpoint, prefix: str) -> None:
        ckpt.copy_into(self.weight, ckpt.read(f"{prefix}.weight", (self.dim,)), f"{prefix}.weight")
        ckpt.copy_into(self.bias, ckpt.read(f"{prefix}.bias", (self.dim,)), f"{prefix}.bias")
