"""The matrix product under every linear layer and the LM head: y = x @ W (+ bias).

Weights load as plain [in, out] tensors. On CPU, `prepack_weights(model)` then hands each one to
oneDNN in the blocked layout its kernels read best (torch.ops.mkldnn._reorder_linear_weight), the
plain tensor is freed, and `GemmWeight.matmul` calls oneDNN's linear on the packed copy.

Why (SmolLM2-135M's 30 layers of linear weights, 212 MB in bf16, streamed from memory as in a
decode step, 2 threads, this machine; benchmarks/bench_model.py shows the effect on whole steps):

    batch rows                      1        8       64
    bf16  torch.mm on [in, out]   20.6 ms  26.1 ms  57.0 ms
    bf16  oneDNN, packed          14.8 ms  14.5 ms  40.4 ms
    fp32  torch.mm on [in, out]   31.1 ms  66.0 ms   163 ms
    fp32  oneDNN, packed          26.5 ms  28.7 ms  91.9 ms

In bf16 the packed product is bit-identical to torch.mm on the plain weight (torch sends bf16
matmuls to the same oneDNN kernels; checked at 1 to 300 rows), so bf16 outputs do not move. In
fp32, torch.mm goes to MKL's sgemm and oneDNN sums in another order: outputs differ in the last
bits (the fp32 parity tests against transformers stay token-exact).

A tied LM head packs its own copy of the embedding (the lookup keeps the plain one): SmolLM2's
adds 57 MB in bf16. `ZSERVE_GEMM=torch` keeps the plain tensors and torch.mm (the reference path).
"""

from __future__ import annotations

import os

import torch
from torch import nn

GEMM_ENV = "ZSERVE_GEMM"  # auto (default: packed where oneDNN can) | torch (plain torch.mm)


def packing_available(device: torch.device, dtype: torch.dtype, choice: str | None = None) -> bool:
    """Whether `prepack_weights` packs for oneDNN here; `choice` defaults to $ZSERVE_GEMM."""
    choice = choice or os.environ.get(GEMM_ENV) or "auto"
    if choice not in ("auto", "torch"):
        raise ValueError(f"{GEMM_ENV}={choice!r}: expected auto or torch")
    return (
        choice == "auto"
        and device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class GemmWeight(nn.Module):
    """Holds a [in, out] weight (`weight`, a Parameter the checkpoint fills) until `pack()`,
    then the packed copy (`packed`) instead."""

    weight: nn.Parameter | None
    packed: torch.Tensor | None

    def init_weight(self, in_features: int, out_features: int) -> None:
        self.weight_shape = (in_features, out_features)
        self.weight = nn.Parameter(torch.empty(in_features, out_features), requires_grad=False)  # [in, out]
        self.register_buffer("packed", None, persistent=False)

    def plain_weight(self) -> torch.Tensor:
        """The [in, out] tensor to pack (a tied LM head returns its embedding's)."""
        assert self.weight is not None, "packed already"
        return self.weight

    def pack(self, free_plain: bool = True) -> None:
        weight_out_in = self.plain_weight().t().contiguous()  # oneDNN's linear takes [out, in]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight_out_in, None)  # no batch-size hint: one layout for all
        if free_plain:
            self.weight = None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]"""
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, bias, "none", [], "")
        weight = self.plain_weight()
        return torch.addmm(bias, x, weight) if bias is not None else torch.mm(x, weight)


def prepack_weights(model: nn.Module) -> int:
    """Pack every GemmWeight of `model` (after loading); returns how many were packed."""
    modules = [m for m in model.modules() if isinstance(m, GemmWeight)]
    for module in modules:
        module.pack()
    return len(modules)


def gemm_weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of every matrix a forward multiplies by (plain or packed): what a decode step reads."""
    return sum(m.weight_shape[0] * m.weight_shape[1] * dtype.itemsize for m in model.modules() if isinstance(m, GemmWeight))
