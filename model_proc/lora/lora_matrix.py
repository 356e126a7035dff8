"""LoraMatrix: one stacked LoRA matrix (lora_layer.py's shrink or expand) as a GemmWeight, so it runs on the
server's weight kernel (--gemm-backend: zserve's bf16 tiles, AMX, ...) in the model's dtype, like the projection it
adapts. PyTorch's own CPU products of these shapes run ~10x slower in bf16 than in float32 (measured: 190 us
against 17 us for [8, 576] @ [576, 48] @ [48, 1728]); the kernel's do not."""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel


class LoraMatrix(GemmWeight):
    def __init__(self, values: torch.Tensor, kernel: WeightKernel | None):
        """`values` [in, out] in the compute dtype, on the device; `kernel`: None keeps torch's product."""
        super().__init__()
        self.init_weight(*values.shape)
        self.weight = nn.Parameter(values, requires_grad=False)
        self.weight_device = values.device
        self.pack(kernel or TorchKernel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, None)
