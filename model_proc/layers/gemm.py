"""The matrix product under every linear layer and the LM head: y = x @ W (+ bias).

`GemmWeight` is what such a layer holds, in vLLM's three steps:

    init_weight   the plain [in, out] Parameter (allocated, not yet written: no memory is touched
                  until float rows arrive). `fill_weight` writes float rows into it, or keeps a
                  weight the checkpoint stored quantized as stored (never dequantized into it)
    pack(kernel)  the kernel's layout of that weight (a PackedWeight), as soon as the layer has
                  loaded (`pack_as_loaded`: the load peak is the packed model plus one matrix, never
                  the whole model in 16 bits); the plain one is freed unless the kernel runs from it
                  (torch). A stored weight the kernel runs as it is (`WeightKernel.takes_stored`)
                  never touches the plain one; else it is dequantized into it first
    matmul(x)     one call into the kernel

The kernels, their layouts and measurements are in weight_kernels/ (registry.py chooses one per
server). A tied LM head packs its own copy of the embedding (the lookup keeps the plain tensor):
SmolLM2's adds 57 MB in bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel
from zserve.model_proc.weights.column_pieces import ColumnPieces
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks
from zserve.model_proc.weights.quantized_weight import (
    QuantizedWeight,
    join_columns,
    on_device,
    unpacked_join,
)

COMPACT_BUFFERS = ("packed_scale_supers", "packed_scale_subs", "packed_offset_supers", "packed_offset_subs")


class GemmWeight(nn.Module):
    """Holds a [in, out] weight (`weight`, a Parameter the checkpoint fills) until `pack()`, then
    the packed state (`packed`) instead. A subclass with a `bias` Parameter gets it packed too."""

    weight: nn.Parameter | None

    def init_weight(self, in_features: int, out_features: int) -> None:
        self.weight_shape = (in_features, out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)  # [in, out]
        self.weight_device = self.weight.device  # where the packed weight lives (the plain one may never be written)
        self.kernel: WeightKernel = TorchKernel()
        self.packed: PackedWeight | None = None
        self.stored_parts: list[tuple[int, QuantizedWeight]] = []  # (first column, piece) stored quantized
        self.pack_on_load: WeightKernel | None = None  # set by `pack_as_loaded`: pack when `loaded()` is called
        # the packed tensors, registered too so the model's buffers (the runner's memory count) hold them
        for name in ("packed_values", "packed_bias", "packed_scales", "packed_offsets", "packed_many_rows_values",
                     *COMPACT_BUFFERS):
            self.register_buffer(name, None, persistent=False)

    def fill_weight(
        self, ckpt: Checkpoint, loaded: torch.Tensor | QuantizedWeight, name: str, col_offset: int = 0
    ) -> None:
        """Columns col_offset.. of the weight from `loaded`: float rows (`read_weight`'s [out, in])
        written into the plain weight, or a weight stored quantized kept as stored, for `pack`."""
        if isinstance(loaded, torch.Tensor):
            ckpt.copy_into(self.weight, loaded, name, row_offset=col_offset, transposed=True)
            return
        if loaded.in_features != self.weight_shape[0] or col_offset + loaded.out_features > self.weight_shape[1]:
            raise ValueError(
                f"tensor {name!r}: stored weight [{loaded.in_features}, {loaded.out_features}] does not fit columns "
                f"{col_offset}.. of [{self.weight_shape[0]}, {self.weight_shape[1]}]"
            )
        self.stored_parts.append((col_offset, loaded))
        ckpt.mark_loaded(self.weight)

    def loaded(self) -> None:
        """Called by a layer's `load` once every piece of its weight (and bias) is in: packs it
        now when `pack_as_loaded` set a kernel."""
        if self.pack_on_load is not None:
            self.pack(self.pack_on_load)

    def plain_weight(self) -> torch.Tensor:
        """The [in, out] tensor to pack (a tied LM head returns its embedding's)."""
        assert self.weight is not None, "packed already"
        return self.weight

    def stored_weight(self) -> QuantizedWeight | None:
        """The weight as the checkpoint stored it quantized, when every output column came so
        (None: a kernel that quantizes does so from the plain weight). Taken once, by `pack`;
        pieces that do not join into one format are dequantized into the plain weight then."""
        parts, self.stored_parts = self.stored_parts, []
        joined = join_columns(parts, self.weight_shape[1])
        if joined is None:
            self._dequantize_into_plain(parts)
        return joined

    def _dequantize_into_plain(self, parts: list[tuple[int, QuantizedWeight]]) -> None:
        """Write stored pieces' values into the plain weight's columns (a kernel that multiplies floats)."""
        plain = self.plain_weight()
        with torch.no_grad():
            for col, part in parts:
                plain[:, col : col + part.out_features].copy_(part.dequantize())

    def pack(self, kernel: WeightKernel, free_plain: bool = True) -> None:
        """Pack for `kernel` (or the fallback it names for this shape)."""
        kernel = kernel.kernel_for(self.weight_shape[0])
        stored = self.stored_weight()
        if isinstance(stored, (PackedBlocks, ColumnPieces)) and not kernel.takes_stored(stored):
            layout_of_another = stored
            stored = unpacked_join(stored)  # another kernel's layout: the same values as codes [K, N]
            if stored is None:  # pieces that join into no one format: their values
                self._dequantize_into_plain([(0, layout_of_another)])
        if stored is not None and not kernel.takes_stored(stored):
            self._dequantize_into_plain([(0, stored)])
            stored = None
        plain = None if stored is not None else self.plain_weight()  # a stored weight run as it is: never written
        if stored is not None:
            stored = on_device(stored, self.weight_device)
        self.packed = kernel.pack(plain, getattr(self, "bias", None), stored)
        self.kernel = kernel
        values = self.packed.values
        self.packed_values = None if isinstance(values, nn.Parameter) else values  # torch: the layer's own Parameter
        self.packed_bias, self.packed_scales = self.packed.bias, self.packed.scales
        self.packed_offsets = self.packed.offsets
        self.packed_many_rows_values = self.packed.many_rows_values
        compact = self.packed.compact
        for name in COMPACT_BUFFERS:
            setattr(self, name, None if compact is None else getattr(compact, name.removeprefix("packed_")))
        if kernel.repacks and free_plain:
            self.weight = None

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the matrix a forward multiplies by: K x N in `dtype`, or int8 plus fp32 scales."""
        return self.kernel.weight_bytes(self.packed, *self.weight_shape, dtype)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]; `bias` is the layer's bias Parameter or None."""
        return self.kernel.matmul(x, self.packed, bias)


def pack_as_loaded(model: nn.Module, kernel: WeightKernel) -> None:
    """Make every GemmWeight of `model` pack itself for `kernel` as soon as its layer has loaded."""
    for module in model.modules():
        if isinstance(module, GemmWeight):
            module.pack_on_load = kernel


def prepack_weights(model: nn.Module, kernel: WeightKernel) -> int:
    """Pack every GemmWeight of `model` not packed yet (after loading: a tied LM head, or all of
    them without `pack_as_loaded`) for `kernel`; returns how many it packed."""
    modules = [m for m in model.modules() if isinstance(m, GemmWeight) and m.packed is None]
    for module in modules:
        module.pack(kernel)
    return len(modules)


def gemm_weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of every matrix a forward multiplies by (plain or packed): what a decode step reads."""
    return sum(m.weight_bytes(dtype) for m in model.modules() if isinstance(m, GemmWeight))
