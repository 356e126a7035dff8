"""Every weight kernel, in the order `auto` prefers them, and the one place a server's is chosen.

Which kernels run a --quantization is its method's (model_proc/quant/: `runs_on`, `set_up`); a
new layout is one more kernel class in this list.
"""

from __future__ import annotations

import torch

from zserve.common.weight_formats import GEMM_CHOICES
from zserve.model_proc.layers.weight_kernels.float_kernels import (
    OneDnnKernel,
    TorchKernel,
    ZserveBf16Kernel,
    ZserveWidenKernel,
)
from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8TorchKernel, ZserveInt8DotKernel, ZserveInt8Kernel
from zserve.model_proc.layers.weight_kernels.row_split_int8_kernel import RowSplitInt8Kernel
from zserve.model_proc.layers.weight_kernels.row_split_kernel import RowSplitBf16Kernel
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.quant.methods import get_quant_method

KERNELS: tuple[WeightKernel, ...] = (  # preference order: the first that may be picked and runs wins
    RowSplitBf16Kernel(),
    ZserveBf16Kernel(),
    ZserveWidenKernel(),
    OneDnnKernel(),
    TorchKernel(),  # runs everywhere: the fallback of --quantization none
    RowSplitInt8Kernel(),
    ZserveInt8DotKernel(),
    ZserveInt8Kernel(),
    Int8TorchKernel(),  # runs everywhere: the fallback of --quantization int8
)


def choose_kernel(
    device: torch.device, dtype: torch.dtype, choice: str = "auto", quantization: str = "none"
) -> WeightKernel:
    """The kernel for `choice` (a server's --gemm-backend) and `quantization` (--quantization) on
    `device` in `dtype`: a choice this CPU or dtype cannot run falls back to the next that can."""
    if choice not in GEMM_CHOICES:
        raise ValueError(f"--gemm-backend {choice!r}: expected one of {', '.join(GEMM_CHOICES)}")
    method = get_quant_method(quantization)
    kernel = next(k for k in KERNELS if method.runs_on(k) and k.may_pick(choice, device, dtype))
    return method.set_up(kernel)
