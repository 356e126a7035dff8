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
  - "torch" (CUDA, other dtypes, --gemm-backend torch): torch.mm on the plain tensor.

Measured (SmolLM2-135M's 30 layers of linear weights plus its LM head, 269 MB in bf16, streamed
from memory as in a decode step, 2 threads, this machine, one process, interleaved):

    rows of x                   1        8        64      512
    bf16  torch.mm [in, out]   20.6 ms  26.1 ms  57.0 ms        (layers only)
    bf16  oneDNN, packed       13.7 ms  14.4 ms  50.0 ms  341 ms
    bf16  zserve_bf16           8.9 ms   9.6 ms  47.0 ms  333 ms  (8.9 ms = 30 GB/s; 64 and 512 rows
                                                                  before the 4x6 tiles: 0.88-0.89x since)
    fp32  torch.mm [in, out]   31.1 ms  66.0 ms   163 ms        (layers only)
    fp32  oneDNN, packed       26.5 ms  28.7 ms  91.9 ms

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

from zserve.model_proc.kernels.cpu_kernels import load_gemm_bf16, load_gemm_widen

GEMM_CHOICES = ("auto", "zserve_widen", "onednn", "torch")
BLOCK_COLS = 16  # zserve_bf16 and zserve_widen: output columns per packed block
WIDEN_DTYPES = (torch.bfloat16, torch.float16)


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs `dtype` on this CPU (its bf16 packing needs native bf16
    support; asked of torch, which asks the CPU)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gemm_backend(device: torch.device, dtype: torch.dtype, choice: str = "auto") -> str:
    """"zserve_bf16", "zserve_widen", "onednn" or "torch" (see the top) for `choice` (a server's
    --gemm-backend). A choice this CPU or dtype cannot run falls back to the next that can."""
    if choice not in GEMM_CHOICES:
        raise ValueError(f"--gemm-backend {choice!r}: expected one of {', '.join(GEMM_CHOICES)}")
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

    def init_weight(self, in_features: int, out_features: int) -> None:
        self.weight_shape = (in_features, out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)  # [in, out]
        self.register_buffer("packed", None, persistent=False)
        self.register_buffer("packed_bias", None, persistent=False)  # zserve_bf16 / zserve_widen: float32, padded to the blocks

    def plain_weight(self) -> torch.Tensor:
        """The [in, out] tensor to pack (a tied LM head returns its embedding's)."""
        assert self.weight is not None, "packed already"
        return self.weight

    def pack(self, backend: str, free_plain: bool = True) -> None:
        in_features = self.weight_shape[0]
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

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]; `bias` is the layer's bias Parameter or None."""
        if self.backend == "zserve_bf16":
            return torch.ops.zserve.gemm_bf16(x.contiguous(), self.packed, self.weight_shape[1], self.packed_bias if bias is not None else None)
        if self.backend == "zserve_widen":
            return torch.ops.zserve.gemm_widen(x.contiguous(), self.packed, self.weight_shape[1], self.packed_bias if bias is not None else None)
        if self.backend == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")
        weight = self.plain_weight()
        return torch.addmm(bias, x, weight) if bias is not None else torch.mm(x, weight)


def prepack_weights(model: nn.Module, backend: str) -> int:
    """Pack every GemmWeight of `model` (after loading) for `backend`; returns how many."""
    modules = [m for m in model.modules() if isinstance(m, GemmWeight)]
    for module in modules:
        module.pack(backend)
    return len(modules) if backend != "torch" else 0


def gemm_weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of every matrix a forward multiplies by (plain or packed): what a decode step reads."""
    return sum(m.weight_shape[0] * m.weight_shape[1] * dtype.itemsize for m in model.modules() if isinstance(m, GemmWeight))
