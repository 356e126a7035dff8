"""zserve_bf16+onednn: a bf16 weight in both layouts, each product run by the kernel that is faster
for its number of rows.

zserve_bf16 streams each weight once per call at the machine's read bandwidth: the fastest for a
decode step of one or a few rows. oneDNN reuses each weight tile across many rows (AMX tiles where
the CPU has them): on an AVX512-BF16 + AMX Xeon (2 vCPU) it multiplies 64 rows 5x and 512 rows 6-9x
faster than zserve_bf16, and one row 1.2-2x slower (BENCHMARKS.md section 20). So products of at
least `min_onednn_rows` rows (prefill chunks, large decode batches) go to oneDNN, the others to
zserve_bf16. The price is a second copy of every weight (the runner's memory count includes it,
so the KV pool is sized after it; where that copy would take over a quarter of the memory free after
loading, the runner keeps one copy, zserve_bf16's). `calibrated()` measures the crossover on this
CPU once, at load.

Numerics: both sum in fp32 and round once; a row's result can differ by one ulp between the two
(zserve_bf16 against torch.mm, see __init__.py), so in bf16 a request's tokens may depend on what
it is batched with, as with the chunked prefill of one kernel; fp32 servers never use this kernel.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch

from zserve.model_proc.layers.weight_kernels.float_kernels import (
    OneDnnKernel,
    ZserveBf16Kernel,
    gemm_bf16,
    onednn_linear,
    onednn_supports,
)
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight, WeightKernel
from zserve.model_proc.weights.quantized_weight import QuantizedWeight

logger = logging.getLogger("model_proc")

DEFAULT_MIN_ONEDNN_ROWS = 8  # before calibration: the crossover measured on an AVX512-BF16 + AMX Xeon
CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CALIBRATION_SHAPE = (1024, 1024)  # (in, out): a mid-size layer's
ONEDNN_WINS_BELOW = 0.9  # oneDNN takes a row count where it needs < 0.9x zserve_bf16's time (and at every larger one)
NEVER = 1 << 30


@dataclass(frozen=True)
class RowSplitBf16Kernel(WeightKernel):
    name = "zserve_bf16+onednn"
    quantization = "none"
    choices = ("auto",)
    extra_weight_copies = 1
    min_onednn_rows: int = DEFAULT_MIN_ONEDNN_ROWS

    @staticmethod
    def runs(device: torch.device, dtype: torch.dtype) -> bool:
        return ZserveBf16Kernel.runs(device, dtype) and onednn_supports(dtype)

    def kernel_for(self, in_features: int) -> WeightKernel:
        return ZserveBf16Kernel().kernel_for(in_features) if in_features % 2 else self

    def pack(self, plain: torch.Tensor, bias: torch.Tensor | None, stored: QuantizedWeight | None) -> PackedWeight:
        few = ZserveBf16Kernel().pack(plain, bias, stored)
        many = OneDnnKernel().pack(plain, bias, stored)
        return replace(few, many_rows_values=many.values)

    def matmul(self, x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] >= self.min_onednn_rows:
            return onednn_linear(x, packed.many_rows_values, bias)
        return gemm_bf16(x, packed, bias)

    def one_copy(self) -> WeightKernel:
        return ZserveBf16Kernel()

    def calibrated(self) -> RowSplitBf16Kernel:
        """This kernel with the crossover measured here: the fewest rows from which oneDNN is faster
        on a mid-size weight at that row count and every larger one measured."""
        min_rows, timings = measure_crossover()
        logger.info(
            "bf16 GEMM: zserve_bf16 below %s rows, oneDNN from there (measured, oneDNN / zserve_bf16 time at %s)",
            min_rows if min_rows < NEVER else "any number of", timings,
        )
        return replace(self, min_onednn_rows=min_rows)


def measure_crossover(
    few: WeightKernel = ZserveBf16Kernel(), many: WeightKernel = OneDnnKernel(), repeats: int = 3
) -> tuple[int, str]:
    """(the crossover row count, or NEVER; the ratios measured, as text). `few` and `many` run on
    one random bf16 weight of CALIBRATION_SHAPE at each of CALIBRATION_ROWS, interleaved, best of
    `repeats`: the fewest rows from which `many` takes < ONEDNN_WINS_BELOW of `few`'s time, there and
    at every larger row count."""
    g = torch.Generator().manual_seed(0)
    plain = torch.randn(*CALIBRATION_SHAPE, generator=g).to(torch.bfloat16)
    kernels = (few, many)
    packs = [k.pack(plain, None, None) for k in kernels]
    ratios = {}
    for rows in CALIBRATION_ROWS:
        x = torch.randn(rows, CALIBRATION_SHAPE[0], generator=g).to(torch.bfloat16)
        best_s = [float("inf")] * 2
        calls = max(2, 64 // rows)
        for _ in range(repeats):
            for i, (kernel, packed) in enumerate(zip(kernels, packs, strict=True)):
                kernel.matmul(x, packed, None)  # warm
                t0 = time.perf_counter()
                for _ in range(calls):
                    kernel.matmul(x, packed, None)
                best_s[i] = min(best_s[i], (time.perf_counter() - t0) / calls)
        ratios[rows] = best_s[1] / best_s[0]
    min_rows = NEVER
    for rows in reversed(CALIBRATION_ROWS):  # the smallest row count from which `many` keeps winning
        if ratios[rows] >= ONEDNN_WINS_BELOW:
            break
        min_rows = rows
    return min_rows, ", ".join(f"{rows}: {ratio:.2f}" for rows, ratio in ratios.items())
