"""The kernels of weights kept in the compute dtype (--quantization none); see __init__.py for
what each runs and what it measured.

    torch         torch.mm on the plain [in, out] tensor (CUDA, dtypes no other runs, the reference)
    onednn        oneDNN's linear on a weight reordered into its blocked layout
    zserve_bf16   kernels/gemm_bf16.cpp (VDPBF16PS) on pairs of k in blocks of 16 columns
    zserve_widen  kernels/gemm_widen.cpp: 16-bit weights widened to fp32 in registers
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from zserve.common.weight_formats import GEMM_CHOICES
from zserve.model_proc.kernels.cpu_kernels import load_gemm_bf16, load_gemm_widen
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel
from zserve.model_proc.weights.column_blocks import (
    pack_bf16_blocks,
    pack_column_blocks,
    padded_bias,
)
from zserve.model_proc.weights.quantized_weight import QuantizedWeight

WIDEN_DTYPES = (torch.bfloat16, torch.float16)


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs `dtype` on this CPU (its bf16 packing needs native bf16
    support; asked of torch, which asks the CPU)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True)
class TorchKernel(WeightKernel):
    name = "torch"
    quantization = "none"
    choices = GEMM_CHOICES
    repacks = False

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return True

    def pack(self, plain: torch.Tensor, bias: torch.Tensor | None, stored: QuantizedWeight | None) -> PackedWeight:
        return PackedWeight(plain, plain.shape[1])

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.addmm(bias, x, packed.values) if bias is not None else torch.mm(x, packed.values)


@dataclass(frozen=True)
class OneDnnKernel(WeightKernel):
    name = "onednn"
    quantization = "none"
    choices = ("auto", "zserve_bf16", "zserve_widen", "onednn")

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and onednn_supports(dtype)

    def pack(self, plain: torch.Tensor, bias: torch.Tensor | None, stored: QuantizedWeight | None) -> PackedWeight:
        # oneDNN's linear takes [out, in]; no batch-size hint: one layout for every batch
        values = torch.ops.mkldnn._reorder_linear_weight(plain.detach().t().contiguous(), None)
        return PackedWeight(values, plain.shape[1])

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        return onednn_linear(x, packed.values, bias)


def onednn_linear(x: torch.Tensor, reordered: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear on a weight `_reorder_linear_weight` made (OneDnnKernel, and the many-row half
    of zserve_bf16+onednn)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), reordered, bias, "none", [], "")


@dataclass(frozen=True)
class BlockKernel(WeightKernel):
    """zserve's 16-bit kernels: the weight in a block layout (column_blocks.py), the bias in fp32
    padded to the blocks."""

    quantization = "none"

    @staticmethod
    @abstractmethod
    def pack_blocks(weight_in_out: torch.Tensor) -> torch.Tensor: ...

    def pack(self, plain: torch.Tensor, bias: torch.Tensor | None, stored: QuantizedWeight | None) -> PackedWeight:
        values = self.pack_blocks(plain.detach())
        return PackedWeight(values, plain.shape[1], bias=padded_bias(bias, values.shape[0]))


@dataclass(frozen=True)
class ZserveWidenKernel(BlockKernel):
    name = "zserve_widen"
    choices = ("auto", "zserve_bf16", "zserve_widen")
    pack_blocks = staticmethod(pack_column_blocks)

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype in WIDEN_DTYPES and load_gemm_widen() is not None

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        packed_bias = packed.bias if bias is not None else None
        return torch.ops.zserve.gemm_widen(x.contiguous(), packed.values, packed.out_features, packed_bias)


@dataclass(frozen=True)
class ZserveBf16Kernel(BlockKernel):
    name = "zserve_bf16"
    choices = ("auto", "zserve_bf16")
    pack_blocks = staticmethod(pack_bf16_blocks)

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype == torch.bfloat16 and load_gemm_bf16() is not None

    def kernel_for(self, in_features: int) -> WeightKernel:
        if in_features % 2:  # the kernel reads k in pairs
            return ZserveWidenKernel() if load_gemm_widen() is not None else OneDnnKernel()
        return self

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        return gemm_bf16(x, packed, bias)


def gemm_bf16(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """kernels/gemm_bf16.cpp on `packed`'s blocks (ZserveBf16Kernel, and the few-row half of
    zserve_bf16+onednn)."""
    packed_bias = packed.bias if bias is not None else None
    return torch.ops.zserve.gemm_bf16(x.contiguous(), packed.values, packed.out_features, packed_bias)
