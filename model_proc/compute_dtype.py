"""The compute dtype: what `--dtype auto` means on this machine, and why.

    CUDA                                         -> bfloat16
    CPU with native bf16 (avx512_bf16, amx_bf16) -> bfloat16   VDPBF16PS / oneDNN bf16 GEMMs, ~5x fp32's rate
    CPU with AVX2 + FMA + F16C and the kernels   -> bfloat16   the widening GEMM (kernels/gemm_widen.cpp)
                                                               reads half of fp32's bytes: on a Zen 3
                                                               (AVX2) SmolLM2-135M's decode step took
                                                               0.45x fp32's time at batch 1, 0.7-0.9x at
                                                               8-64, and a 512-token prefill the same
    other CPUs (no AVX2, or no kernels built)    -> float32    bf16 there is emulated: slower than fp32

In bf16 the weights, activations and KV cache are bf16; what needs more precision is computed in
fp32 and cast back, as transformers does: norm statistics (norm.py), rotary cos/sin (rotary.py),
the softmax inside attention (SDPA's CPU kernels accumulate reduced types in fp32), and the
logits, which leave the LM head as fp32 for sampling (embedding.py).
"""

from __future__ import annotations

import torch

from zserve.common.weight_formats import DTYPE_CHOICES

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}
assert set(DTYPES) == set(DTYPE_CHOICES) - {"auto"}, "one torch dtype per --dtype name common/weight_formats.py offers"
NATIVE_BF16_CPU_FEATURES = ("avx512_bf16", "amx_bf16")  # x86 instruction sets with bf16 dot products


def native_bf16_feature() -> str | None:
    """The first of NATIVE_BF16_CPU_FEATURES this CPU has (torch's cpuinfo query), or None."""
    capabilities = torch.cpu.get_capabilities()
    return next((name for name in NATIVE_BF16_CPU_FEATURES if capabilities.get(name) is True), None)


def widening_gemm_level() -> str | None:
    """The feature set (its name) of the widening 16-bit GEMM when it runs in this process, else None."""
    from zserve.model_proc.kernels.cpu_isa import cpu_isa
    from zserve.model_proc.kernels.cpu_kernels import load_gemm_widen

    return cpu_isa().name if load_gemm_widen() is not None else None


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> tuple[torch.dtype, str]:
    """(compute dtype, why it was chosen, for the startup log)."""
    if isinstance(dtype, torch.dtype):
        return dtype, "asked for"
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16, "auto: CUDA"
        feature = native_bf16_feature()
        if feature is not None:
            return torch.bfloat16, f"auto: this CPU has {feature}"
        level = widening_gemm_level()
        if level is not None:
            return torch.bfloat16, (
                f"auto: bf16 weights widened to fp32 in registers ({level} kernels) read half of fp32's bytes"
            )
        return torch.float32, (
            f"auto: this CPU has none of {', '.join(NATIVE_BF16_CPU_FEATURES)} "
            "and the widening GEMM (AVX2 + FMA + F16C kernels) "
            "does not run here, so bf16 would be emulated"
        )
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype], f"--dtype {dtype}"
