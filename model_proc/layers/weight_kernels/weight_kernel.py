"""The interface every GEMM under the linear layers and the LM head implements.

vLLM's LinearMethodBase is the anchor: its create_weights / process_weights_after_loading /
apply are here GemmWeight.init_weight (the plain [in, out] Parameter the checkpoint fills),
`WeightKernel.pack` (that weight, or the pre-quantized one the checkpoint returned, into the
kernel's layout: a `PackedWeight`) and `WeightKernel.matmul` (x @ W + bias from that state).

A kernel is a small stateless frozen dataclass; registry.py lists them in the order `auto`
prefers them and picks one per server (`choose_kernel`). Each declares its family of weights
(the quantization methods in model_proc/quant/ say which they run on), which --gemm-backend values
may pick it, and whether it runs on a device and dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.quantized_weight import QuantizedWeight


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """What a kernel's matmul runs from: its layout of one [in, out] weight."""

    values: torch.Tensor  # the kernel's layout (torch: the plain [in, out] tensor itself, not a copy)
    out_features: int
    bias: torch.Tensor | None = None  # block layouts: the layer's bias, float32, padded to the blocks
    scales: torch.Tensor | None = None  # int8: float32 scales per group of input rows
    group_size: int = 0  # int8: input rows per scale
    offsets: torch.Tensor | None = None  # int8 / 4-bit codes with a zero point: float32, like the scales
    bits: int = 16  # of `values`' codes: 16 (float), 8 (int8), 6 (six_bit_codes.py) or 4 (nibbles)
    many_rows_values: torch.Tensor | None = None  # zserve_bf16+onednn: oneDNN's layout, for products of many rows
    compact: CompactScales | None = None  # a GGUF file's scales and offsets as it keeps them, instead of fp32 ones
    pieces: tuple[PackedWeight, ...] = ()  # column pieces each in its own format (weights/column_pieces.py); `values`
    # is then empty and the product is the pieces' side by side


class WeightKernel(ABC):
    name: ClassVar[str]  # what the log and `ModelRunner.gemm_backend` call it
    quantization: ClassVar[str]  # its family: "none" (floats) or "int8"; a method's `kernel_family` (model_proc/quant/)
    takes_4bit_and_offsets: ClassVar[bool] = False  # runs 4-bit codes and codes with offsets (GGUF's, int4's)
    choices: ClassVar[tuple[str, ...]]  # the --gemm-backend values that may pick it
    repacks: ClassVar[bool] = True  # False: it runs from the plain tensor, which the layer keeps
    extra_weight_copies: ClassVar[int] = 0  # copies of the weights it keeps beyond one (zserve_bf16+onednn: 1)

    @staticmethod
    @abstractmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        """Whether it runs `dtype` on `device` here (a CPU kernel: whether it was built)."""

    def may_pick(self, choice: str, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether a server's --gemm-backend `choice` gets this kernel on `device` in `dtype`."""
        return choice in self.choices and self.runs(device, dtype)

    def one_copy(self) -> WeightKernel:
        """The kernel to run instead when the extra copies do not fit (extra_weight_copies 0: itself)."""
        return self

    def calibrated(self) -> WeightKernel:
        """This kernel with whatever it measures once per process on this CPU (most: nothing)."""
        return self

    def kernel_for(self, in_features: int) -> WeightKernel:
        """The kernel that runs a weight of `in_features` rows: this one, or a fallback."""
        return self

    def takes_stored(self, stored: QuantizedWeight) -> bool:
        """Whether `pack` runs `stored` as it is, without the plain weight (float kernels: never;
        the layer then dequantizes it into the plain weight and passes that instead)."""
        return False

    @abstractmethod
    def pack(
        self, plain: torch.Tensor | None, bias: torch.Tensor | None, stored: QuantizedWeight | None
    ) -> PackedWeight:
        """The state `matmul` runs from: `plain` (the [in, out] weight; None when `stored` is given,
        which `takes_stored` accepted), `bias` (the layer's bias Parameter or None) and `stored` (the
        weight as the checkpoint stored it quantized, every output column; None when it came in floats)."""

    @abstractmethod
    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]; `bias` is the layer's bias Parameter or None (a TP rank > 0's row-parallel layer)."""

    def weight_bytes(self, packed: PackedWeight | None, in_features: int, out_features: int, dtype: torch.dtype) -> int:
        """Bytes of the matrix a forward multiplies by (`packed` None: not packed yet)."""
        return in_features * out_features * dtype.itemsize
