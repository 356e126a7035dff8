"""The matrix product under every linear layer and the LM head: y = x @ W (+ bias).

`GemmWeight` is what such a layer holds, in vLLM's three steps:

    init_weight   the plain [in, out] Parameter the checkpoint fills (`fill_weight`: float rows,
                  or a weight the checkpoint stored quantized, kept as stored for `pack`)
    pack(kernel)  after loading: the kernel's layout of that weight (a PackedWeight); the plain
                  one is freed unless the kernel runs from it (torch)
    matmul(x)     one call into the kernel

The kernels, their layouts and measurements are in weight_kernels/ (registry.py chooses one per
server). A tied LM head packs its own copy of the embedding (the lookup keeps the plain tensor):
SmolLM2's adds 57 MB in bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.checkpoint import Checkpoint
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.quantized_weight import (
    QuantizedWeight,
    join_columns,
    split_loaded,
)
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel


class GemmWeight(nn.Module):
    """Holds a [in, out] weight (`weight`, a Parameter the checkpoint fills) until `pack()`, then
    the packed state (`packed`) instead. A subclass with a `bias` Parameter gets it packed too."""

    weight: nn.Parameter | None

    def init_weight(self, in_features: int, out_features: int) -> None:
        self.weight_shape = (in_features, out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)  # [in, out]
        self.kernel: WeightKernel = TorchKernel()
        self.packed: PackedWeight | None = None
        self.stored_parts: list[tuple[int, QuantizedWeight]] = []  # (first column, piece) stored quantized
        # the packed tensors, registered too so the model's buffers (the runner's memory count) hold them
        for name in ("packed_values", "packed_bias", "packed_scales", "packed_offsets", "packed_many_rows_values"):
            self.register_buffer(name, None, persistent=False)

    def fill_weight(
        self, ckpt: Checkpoint, loaded: torch.Tensor | QuantizedWeight, name: str, col_offset: int = 0
    ) -> None:
        """Columns col_offset.. of the plain weight from `loaded` (`read_weight`'s [out, in] rows);
        a weight stored quantized is also kept as stored, for `pack`."""
        rows, stored = split_loaded(loaded)
        if stored is not None:
            self.stored_parts.append((col_offset, stored))
        ckpt.copy_into(self.weight, rows, name, row_offset=col_offset, transposed=True)

    def plain_weight(self) -> torch.Tensor:
        """The [in, out] tensor to pack (a tied LM head returns its embedding's)."""
        assert self.weight is not None, "packed already"
        return self.weight

    def stored_weight(self) -> QuantizedWeight | None:
        """The weight as the checkpoint stored it quantized, when every output column came so
        (None: a kernel that quantizes does so from the plain weight). Taken once, by `pack`."""
        parts, self.stored_parts = self.stored_parts, []
        return join_columns(parts, self.weight_shape[1])

    def pack(self, kernel: WeightKernel, free_plain: bool = True) -> None:
        """Pack for `kernel` (or the fallback it names for this shape)."""
        kernel = kernel.kernel_for(self.weight_shape[0])
        self.packed = kernel.pack(self.plain_weight(), getattr(self, "bias", None), self.stored_weight())
        self.kernel = kernel
        values = self.packed.values
        self.packed_values = None if isinstance(values, nn.Parameter) else values  # torch: the layer's own Parameter
        self.packed_bias, self.packed_scales = self.packed.bias, self.packed.scales
        self.packed_offsets = self.packed.offsets
        self.packed_many_rows_values = self.packed.many_rows_values
        if kernel.repacks and free_plain:
            self.weight = None

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the matrix a forward multiplies by: K x N in `dtype`, or int8 plus fp32 scales."""
        return self.kernel.weight_bytes(self.packed, *self.weight_shape, dtype)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]; `bias` is the layer's bias Parameter or None."""
        return self.kernel.matmul(x, self.packed, bias)


def prepack_weights(model: nn.Module, kernel: WeightKernel) -> int:
    """Pack every GemmWeight of `model` (after loading) for `kernel`; returns how many."""
    modules = [m for m in model.modules() if isinstance(m, GemmWeight)]
    for module in modules:
        module.pack(kernel)
    return len(modules)


def gemm_weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of every matrix a forward multiplies by (plain or packed): what a decode step reads."""
    return sum(m.weight_bytes(dtype) for m in model.modules() if isinstance(m, GemmWeight))
