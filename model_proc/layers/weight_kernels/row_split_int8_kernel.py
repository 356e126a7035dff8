"""zserve_int8_dot+onednn: int8 weights for products of few rows, a bf16 copy of the same
(dequantized) weights for products of many, each run by the kernel that is faster there.

zserve_int8_dot streams half of bf16's bytes per decode step and multiplies in int8 (VPDPBUSD):
the fastest for one to a few dozen rows. On a CPU whose oneDNN multiplies bf16 in AMX tiles, oneDNN
is faster from some number of rows on (a 512-row prefill of the demo model's layers: AMX bf16
several times faster than VPDPBUSD on a 2-vCPU Xeon), so products of at least `min_onednn_rows`
rows go to oneDNN on the dequantized weight Q * S rounded to bf16. The price is that bf16 copy
(2 bytes per weight beside int8's 1: less than zserve_bf16+onednn's two bf16 copies; the runner
keeps one copy, zserve_int8_dot's, where it would take over a quarter of the memory free after
loading). `calibrated()` measures the crossover on this CPU at load (row_split_kernel.py's
measurement, NEVER where oneDNN does not win: then no copy is kept).

Numerics: a product of few rows quantizes its activations (layers/int8_activations.py); one of
many multiplies bf16 activations by bf16(Q * S), summed in fp32: a request's tokens may depend
on what it is batched with, as with zserve_bf16+onednn. bf16 only (oneDNN's bf16 packing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from zserve.model_proc.layers.weight_kernels.float_kernels import OneDnnKernel, onednn_linear, onednn_supports
from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8Kernel, ZserveInt8DotKernel, gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.row_split_kernel import (
    DEFAULT_MIN_ONEDNN_ROWS,
    NEVER,
    measure_crossover,
)
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel
from zserve.model_proc.weights.column_pieces import ColumnPieces
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks
from zserve.model_proc.weights.quantized_weight import QuantizedWeight

logger = logging.getLogger("model_proc")


@dataclass(frozen=True)
class RowSplitInt8Kernel(Int8Kernel):
    name = "zserve_int8_dot+onednn"
    choices = ("auto",)
    takes_4bit_and_offsets = True
    extra_weight_copies = 1  # a bf16 copy: the plain weights' bytes, as the runner counts them
    min_onednn_rows: int = DEFAULT_MIN_ONEDNN_ROWS

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return dtype == torch.bfloat16 and ZserveInt8DotKernel.runs(device, dtype) and onednn_supports(dtype)

    def kernel_for(self, in_features: int) -> WeightKernel:
        # zserve_int8 where K is off 32
        few = ZserveInt8DotKernel(self.group_size, self.weight_bits).kernel_for(in_features)
        return self if isinstance(few, ZserveInt8DotKernel) and self.min_onednn_rows < NEVER else few

    def one_copy(self) -> WeightKernel:
        return ZserveInt8DotKernel(self.group_size, self.weight_bits)

    def takes_stored(self, stored: QuantizedWeight) -> bool:
        return ZserveInt8DotKernel(self.group_size, self.weight_bits).takes_stored(stored)

    def pack(
        self, plain: torch.Tensor | None, bias: torch.Tensor | None, stored: QuantizedWeight | None
    ) -> PackedWeight:
        few_kernel = ZserveInt8DotKernel(self.group_size, self.weight_bits)
        weight = stored if isinstance(stored, (PackedBlocks, ColumnPieces)) else few_kernel.dot_weight(plain, stored)
        few = few_kernel.pack(plain, bias, weight)
        many = OneDnnKernel().pack(weight.dequantize().to(torch.bfloat16), bias, None)
        return replace(few, many_rows_values=many.values)

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] >= self.min_onednn_rows:
            return onednn_linear(x, packed.many_rows_values, bias)
        return gemm_int8_dot(x, packed, bias)

    def calibrated(self) -> RowSplitInt8Kernel:
        """This kernel with the crossover measured here (NEVER: every product through zserve_int8_dot,
        and `kernel_for` then packs no bf16 copy)."""
        min_rows, timings = measure_crossover(ZserveInt8DotKernel(self.group_size, self.weight_bits), OneDnnKernel())
        logger.info(
            "int8 GEMM: zserve_int8_dot below %s rows, oneDNN bf16 from there "
            "(measured, oneDNN / zserve_int8_dot time at %s)",
            min_rows if min_rows < NEVER else "any number of", timings,
        )
        return replace(self, min_onednn_rows=min_rows)
