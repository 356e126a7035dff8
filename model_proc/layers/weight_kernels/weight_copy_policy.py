"""--gemm-weight-copy: whether a kernel that can keep a second copy of the weights keeps it.

Two kernels keep one (`extra_weight_copies`): zserve_bf16+onednn (bf16 weights in our layout and in
oneDNN's) and zserve_int8_dot+onednn (int8 or 4-bit codes, and a bf16 copy of their values for
oneDNN). Products of many rows (prefill chunks, large batches) go to oneDNN, whose bf16 GEMM runs
in AMX tiles where the CPU has them; the copy costs memory the KV pool would get.

    auto   keep it while it fits EXTRA_COPY_MAX_SHARE of the memory free after loading, except beside
           the codes of a file that stores its weights quantized (GGUF, AWQ, GPTQ): whoever serves a
           4-bit file budgets for the file's size, so its bf16 values (3.5x a Q4_K file's bytes) are
           not kept unless asked
    on     keep it (the crossover is still measured at start: where oneDNN never wins, no copy)
    off    never: one copy, the few-rows kernel for every product
"""

from __future__ import annotations

from dataclasses import dataclass

from zserve.common.weight_formats import WEIGHT_COPY_CHOICES
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel

EXTRA_COPY_MAX_SHARE = 0.25  # of the memory free after loading, for `auto`


@dataclass(frozen=True)
class CopyDecision:
    kernel: WeightKernel  # the kernel to run
    reason: str = ""  # a line saying what was decided and why ("" when there was nothing to decide)
    warning: bool = False  # the copy `auto` would keep did not fit: a warning, not news


@dataclass(frozen=True)
class WeightCopyPolicy:
    choice: str = "auto"
    max_share: float = EXTRA_COPY_MAX_SHARE

    def __post_init__(self) -> None:
        if self.choice not in WEIGHT_COPY_CHOICES:
            raise ValueError(f"--gemm-weight-copy {self.choice!r}: expected one of {', '.join(WEIGHT_COPY_CHOICES)}")

    def apply(
        self, kernel: WeightKernel, plain_bytes: int, free_after_bytes: int, stored_quantized: bool
    ) -> CopyDecision:
        """`plain_bytes`: the linear weights in --dtype (what a copy takes); `free_after_bytes`: the
        memory free once they are loaded; `stored_quantized`: the file stores them quantized."""
        if not kernel.extra_weight_copies:
            return CopyDecision(kernel)
        extra_mb = plain_bytes * kernel.extra_weight_copies / 1e6
        alone = kernel.one_copy()
        if self.choice == "off":
            return CopyDecision(alone, f"--gemm-weight-copy off: {alone.name}, one copy of the weights")
        if self.choice == "on":
            return CopyDecision(kernel, f"--gemm-weight-copy on: {kernel.name} keeps a second copy ({extra_mb:.0f} MB)")
        if stored_quantized and kernel.quantization != "none":
            return CopyDecision(alone, (
                f"{alone.name}: no bf16 copy ({extra_mb:.0f} MB) beside the codes the file stores "
                "(--gemm-weight-copy on keeps one, for oneDNN on products of many rows)"
            ))
        if plain_bytes * kernel.extra_weight_copies > self.max_share * free_after_bytes:
            return CopyDecision(alone, (
                f"{kernel.name} would keep a second {extra_mb:.0f} MB copy of the weights, over "
                f"{100 * self.max_share:.0f}% of the memory free after loading: {alone.name} instead (one copy; "
                "--gemm-weight-copy on keeps it)"
            ), warning=True)
        return CopyDecision(kernel)
