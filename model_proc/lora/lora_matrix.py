"""LoraMatrix: one stacked LoRA matrix (lora_layer.py's shrink or expand) as a GemmWeight, so it runs on the
server's weight kernel (--gemm-backend: zserve's bf16 tiles, AMX, ...) in the model's dtype, like the projection it
adapts. PyTorch's own CPU products of these shapes run ~10x slower in bf16 than in float32 (measured: 190 us
against 17 us for [8, 576] @ [576, 48] @ [48, 1728]); the kernel's do not.

Where the kernel multiplies the step's rows in oneDNN's layout (zserve_bf16+onednn from its calibrated row count,
--gemm-backend onednn), the element-wise step around each product rides in the product as a oneDNN post-op
(`masked`: the shrink times LoraBatch's mask; `added_to`: the base output plus the expand), one pass over the output
instead of two, and one output tensor fewer: a fifth of the products' time with their data in cache, a little of
the prefill step's and within the noise of the decode step's, where each call's cache misses dominate
(BENCHMARKS.md section 33). Other kernels run the product, then the element-wise op.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.weight_kernels.float_kernels import OneDnnKernel, TorchKernel
from zserve.model_proc.layers.weight_kernels.row_split_kernel import RowSplitBf16Kernel
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel

NEVER = 1 << 62  # a row count no step reaches


class LoraMatrix(GemmWeight):
    def __init__(self, values: torch.Tensor, kernel: WeightKernel | None):
        """`values` [in, out] in the compute dtype, on the device; `kernel`: None keeps torch's product."""
        super().__init__()
        self.init_weight(*values.shape)
        self.weight = nn.Parameter(values, requires_grad=False)
        self.weight_device = values.device
        self.pack(kernel or TorchKernel())
        # the oneDNN layout (`_reorder_linear_weight`'s) the kernel multiplies this many rows or more by, if any
        self.onednn_weight, self.onednn_min_rows = onednn_layout(self.kernel, self.packed)
        # oneDNN's linear with an element-wise post-op, looked up once (only where the kernel runs oneDNN)
        self.post_op = None if self.onednn_weight is None else torch.ops.mkldnn._linear_pointwise.binary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, None)

    def masked(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(x @ W) * mask, a fresh tensor; `mask` [T, out] in the compute dtype."""
        if x.shape[0] < self.onednn_min_rows:
            return self.matmul(x, None).mul_(mask)
        return self.post_op(x.contiguous(), mask, self.onednn_weight, None, "mul")

    def added_to(self, y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """y + h @ W: y itself, added to in place, or a fresh tensor where the product's post-op adds it."""
        if h.shape[0] < self.onednn_min_rows:
            return y.add_(self.matmul(h, None))
        return self.post_op(h.contiguous(), y.contiguous(), self.onednn_weight, None, "add")


def onednn_layout(kernel: WeightKernel, packed: PackedWeight) -> tuple[torch.Tensor | None, int]:
    """(the weight in oneDNN's layout, the fewest rows the kernel multiplies by it), or (None, NEVER) for a kernel
    that never runs oneDNN."""
    if isinstance(kernel, RowSplitBf16Kernel):
        return packed.many_rows_values, kernel.min_onednn_rows
    if isinstance(kernel, OneDnnKernel):
        return packed.values, 0
    return None, NEVER
