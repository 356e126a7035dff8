"""The matrix product under every linear layer and the LM head: y = x @ W (+ bias).

Weights load as plain [in, out] tensors. After loading, `prepack_weights(model, backend)` hands
each one to the GEMM that runs it, in the layout that GEMM reads best, and frees the plain one:

  - "zserve_bf16" (CPU, bf16, where model_proc/kernels/ built for avx512_bf16): our kernel
    (kernels/gemm_bf16.cpp) on blocks of 16 columns x pairs of k, so a decode step streams each
    weight once, in order, at the machine's read bandwidth;
  - "zserve_widen" (CPU, bf16 or fp16, kernels built for avx2 or avx512: every current x86-64):
    our kernel (kernels/gemm_widen.cpp) on blocks of 16 columns x k, weights kept 16-bit and
    widened to fp32 in registers (bf16: a shift; fp16: F16C), fp32 FMAs;
  - "onednn" (CPU, fp32; bf16 only where oneDNN has native bf16, i.e. AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT): oneDNN's linear on a weight reordered into its blocked layout
    (torch.ops.mkldnn._reorder_linear_weight, which raises for bf16 on an AVX2-only CPU);
  - "torch" (CUDA, other dtypes, --gemm-backend torch): torch.mm on the plain tensor;
  - "zserve_int8" (--quantization int8, CPU, any runtime dtype, kernels built for avx2 or
    avx512): each weight quantized at load to int8 with fp32 scales per group of input rows
    (int8_weights.py), run by kernels/gemm_int8.cpp in gemm_widen's block layout (int8 widened
    in registers, fp32 sums): half of bf16's bytes per decode step;
  - "int8_torch" (--quantization int8 on CUDA, at the `baseline` level, or with --gemm-backend
    torch): the same int8 values and scales, dequantized on the fly for an fp32 torch.mm (the
    reference: slow, exact).

Measured (SmolLM2-135M's 30 layers of linear weights plus its LM head, 269 MB in bf16, streamed
from memory as in a decode step, 2 threads, this machine, one process, interleaved):

    rows of x                   1        8        64      512
    bf16  torch.mm [in, out]   20.6 ms  26.1 ms  57.0 ms        (layers only)
    bf16  oneDNN, packed       13.7 ms  14.4 ms  50.0 ms  341 ms
    bf16  zserve_bf16           8.9 ms   9.6 ms  47.0 ms  333 ms  (8.9 ms = 30 GB/s; 64 and 512 rows
                                                                  before the 4x6 tiles: 0.88-0.89x since)
    fp32  torch.mm [in, out]   31.1 ms  66.0 ms   163 ms        (layers only)
    fp32  oneDNN, packed       26.5 ms  28.7 ms  91.9 ms

int8 (zserve_int8, groups of 64: 143 MB): a whole batch-1 decode step of the demo model in bf16
takes 0.79x the zserve_widen one on the Zen 3 (2 threads), its GEMMs 12.5 against 19.3 ms a step
(torch.profiler); from 64 rows on it runs at bf16's speed (the scratch tiles are the same).

Numerics: all three sum in fp32 and round to the output dtype once. In bf16, oneDNN-packed
results are bit-identical to torch.mm (torch sends bf16 matmuls to oneDNN); zserve_bf16's differ
from torch.mm in 0 to 3e-4 of the outputs, by one ulp (another summation order). In fp32, oneDNN
sums in another order than MKL's sgemm: outputs differ in the last bits. tests/model/test_gemm.py
checks every backend against the exact product; the parity tests against transformers hold on
each.

A tied LM head packs its own copy of the embedding (the lookup keeps the plain tensor): SmolLM2's
adds 57 MB in bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.kernels.cpu_kernels import load_gemm_bf16, load_gemm_int8, load_gemm_widen
from zserve.model_proc.layers import int8_weights
from zserve.model_proc.layers.int8_weights import (
    QUANTIZATION_CHOICES,
    dequantize_int8,
    pack_column_blocks,
    quantize_int8,
)

GEMM_CHOICES = ("auto", "zserve_widen", "onednn", "torch")
BLOCK_COLS = 16  # zserve_bf16 and zserve_widen: output columns per packed block
WIDEN_DTYPES = (torch.bfloat16, torch.float16)
INT8_BACKENDS = ("zserve_int8", "int8_torch")


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs `dtype` on this CPU (its bf16 packing needs native bf16
    support; asked of torch, which asks the CPU)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gemm_backend(device: torch.device, dtype: torch.dtype, choice: str = "auto", quantization: str = "none") -> str:
    """"zserve_bf16", "zserve_widen", "onednn" or "torch" (see the top) for `choice` (a server's
    --gemm-backend); with `quantization` "int8", "zserve_int8" or "int8_torch". A choice this CPU
    or dtype cannot run falls back to the next that can."""
    if choice not in GEMM_CHOICES:
        raise ValueError(f"--gemm-backend {choice!r}: expected one of {', '.join(GEMM_CHOICES)}")
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"--quantization {quantization!r}: expected one of {', '.join(QUANTIZATION_CHOICES)}")
    if quantization == "int8":
        kernel = device.type == "cpu" and choice != "torch" and load_gemm_int8() is not None
        return "zserve_int8" if kernel else "int8_torch"
    if choice == "torch" or device.type != "cpu":
        return "torch"
    if choice == "auto" and dtype == torch.bfloat16 and load_gemm_bf16() is not None:
        return "zserve_bf16"
    if choice in ("auto", "zserve_widen") and dtype in WIDEN_DTYPES and load_gemm_widen() is not None:
        return "zserve_widen"
    return "onednn" if onednn_supports(dtype) else "torch"


def pack_bf16_blocks(weight_in_out: torch.Tensor) -> torch.Tensor:
    """bf16 [K, N] (K even) -> int32 [ceil(N / 16), K / 2, 16]: block b, pair p, column j holds
    (W[2p, 16b + j], W[2p + 1, 16b + j]), the layout of kernels/gemm_bf16.cpp."""
    k, n = weight_in_out.shape
    padded_n = -(-n // BLOCK_COLS) * BLOCK_COLS
    padded = torch.zeros(k, padded_n, dtype=torch.bfloat16, device=weight_in_out.device)
    padded[:, :n] = weight_in_out
    blocks = padded.view(k // 2, 2, padded_n // BLOCK_COLS, BLOCK_COLS).permute(2, 0, 3, 1).contiguous()  # [NB, K/2, 16, 2]
    return blocks.view(torch.int32).view(padded_n // BLOCK_COLS, k // 2, BLOCK_COLS)


def pack_widen_blocks(weight_in_out: torch.Tensor) -> torch.Tensor:
    """16-bit [K, N] -> same dtype [ceil(N / 16), K, 16]: block b, row k, column j holds
    W[k, 16b + j], the layout of kernels/gemm_widen.cpp."""
    k, n = weight_in_out.shape
    padded_n = -(-n // BLOCK_COLS) * BLOCK_COLS
    padded = torch.zeros(k, padded_n, dtype=weight_in_out.dtype, device=weight_in_out.device)
    padded[:, :n] = weight_in_out
    return padded.view(k, padded_n // BLOCK_COLS, BLOCK_COLS).permute(1, 0, 2).contiguous()


def padded_bias(bias: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """float32 [num_blocks * 16]: the bias the block kernels add in fp32, zero past the outputs."""
    padded = torch.zeros(num_blocks * BLOCK_COLS, dtype=torch.float32)
    padded[: bias.numel()] = bias.detach().float()
    return padded


class GemmWeight(nn.Module):
    """Holds a [in, out] weight (`weight`, a Parameter the checkpoint fills) until `pack()`, then
    the packed copy (`packed`) instead. A subclass with a `bias` Parameter gets it packed too."""

    weight: nn.Parameter | None
    packed: torch.Tensor | None
    backend: str = "torch"
    int8_group_size: int | None = None  # set by prepack_weights

    def init_weight(self, in_features: int, out_features: int) -> None:
        self.weight_shape = (in_features, out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)  # [in, out]
        self.register_buffer("packed", None, persistent=False)
        self.register_buffer("packed_bias", None, persistent=False)  # zserve_bf16 / zserve_widen / zserve_int8: float32, padded to the blocks
        self.register_buffer("packed_scales", None, persistent=False)  # int8: float32 scales (zserve_int8: [NB, K / G, 16])
        self.group_size = 0  # int8: input rows per scale

    def plain_weight(self) -> torch.Tensor:
        """The [in, out] tensor to pack (a tied LM head returns its embedding's)."""
        assert self.weight is not None, "packed already"
        return self.weight

    def pack(self, backend: str, free_plain: bool = True) -> None:
        """Pack for `backend`; the int8 ones quantize in groups of `int8_group_size` input rows
        (None: int8_weights.DEFAULT_GROUP_SIZE; 0: one scale per output column), or take the
        values the checkpoint gave (GGUF Q8_0: an `int8_preset` on the plain weight)."""
        in_features = self.weight_shape[0]
        if backend in INT8_BACKENDS:
            self._pack_int8(backend, int8_weights.DEFAULT_GROUP_SIZE if self.int8_group_size is None else self.int8_group_size)
            if free_plain:
                self.weight = None
            return
        if backend == "zserve_bf16" and in_features % 2:  # the kernel reads k in pairs
            backend = "zserve_widen" if load_gemm_widen() is not None else "onednn"
        if backend == "torch":
            return
        weight = self.plain_weight()
        if backend in ("zserve_bf16", "zserve_widen"):
            self.packed = pack_bf16_blocks(weight.detach()) if backend == "zserve_bf16" else pack_widen_blocks(weight.detach())
            bias = getattr(self, "bias", None)
            if bias is not None:
                self.packed_bias = padded_bias(bias, self.packed.shape[0])
        else:  # oneDNN's linear takes [out, in]; no batch-size hint: one layout for every batch
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().t().contiguous(), None)
        self.backend = backend
        if free_plain:
            self.weight = None

    def _pack_int8(self, backend: str, group_size: int) -> None:
        weight = self.plain_weight()
        preset = getattr(weight, "int8_preset", None)
        if preset is not None:
            del weight.int8_preset  # used once: a tied embedding keeps its parameter
        if preset is not None and preset.complete:
            q, scales, self.group_size = preset.q, preset.scales, preset.group_size
        else:
            in_features = self.weight_shape[0]
            self.group_size = min(group_size, in_features) if group_size > 0 else in_features
            q, scales = quantize_int8(weight, self.group_size)
        if backend == "zserve_int8":
            self.packed, self.packed_scales = pack_column_blocks(q), pack_column_blocks(scales.float())
            bias = getattr(self, "bias", None)
            if bias is not None:
                self.packed_bias = padded_bias(bias, self.packed.shape[0])
        else:
            self.packed, self.packed_scales = q.to(weight.device), scales.float().to(weight.device)
        self.backend = backend

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the matrix a forward multiplies by: K x N in `dtype`, or int8 plus fp32 scales."""
        k, n = self.weight_shape
        if self.backend in INT8_BACKENDS:
            return k * n + -(-k // self.group_size) * n * 4
        return k * n * dtype.itemsize

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]; `bias` is the layer's bias Parameter or None."""
        if self.backend == "zserve_bf16":
            return torch.ops.zserve.gemm_bf16(x.contiguous(), self.packed, self.weight_shape[1], self.packed_bias if bias is not None else None)
        if self.backend == "zserve_widen":
            return torch.ops.zserve.gemm_widen(x.contiguous(), self.packed, self.weight_shape[1], self.packed_bias if bias is not None else None)
        if self.backend == "zserve_int8":
            packed_bias = self.packed_bias if bias is not None else None
            return torch.ops.zserve.gemm_int8(x.contiguous(), self.packed, self.packed_scales, self.weight_shape[1], packed_bias, self.group_size)
        if self.backend == "int8_torch":  # the reference: dequantized to fp32 on the fly, summed in fp32, rounded once
            y = torch.mm(x.float(), dequantize_int8(self.packed, self.packed_scales, self.group_size))
            return (y + bias.float() if bias is not None else y).to(x.dtype)
        if self.backend == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")
        weight = self.plain_weight()
        return torch.addmm(bias, x, weight) if bias is not None else torch.mm(x, weight)


def prepack_weights(model: nn.Module, backend: str, group_size: int | None = None) -> int:
    """Pack every GemmWeight of `model` (after loading) for `backend` (int8: in groups of
    `group_size` input rows, default int8_weights.DEFAULT_GROUP_SIZE); returns how many."""
    modules = [m for m in model.modules() if isinstance(m, GemmWeight)]
    for module in modules:
        module.int8_group_size = group_size
        module.pack(backend)
    return len(modules) if backend != "torch" else 0


def gemm_weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of every matrix a forward multiplies by (plain or packed): what a decode step reads."""
    return sum(m.weight_bytes(dtype) for m in model.modules() if isinstance(m, GemmWeight))
