"""The fp8 KV cache's rows (--kv-cache-dtype fp8_e4m3 / fp8_e5m2; `fp8` is fp8_e4m3, as vLLM and SGLang spell it):
one byte a value with one per-tensor scale of 1.0, vLLM's and SGLang's default when no calibrated scales are given.
A value x is stored as

    fp8(clamp(x, -max, max))    (to nearest even; max = 448 for e4m3, 57344 for e5m2)

and read back as that fp8 value, exactly (every fp8 value is a bf16, fp16 and fp32 one). The clamp comes first as
torch releases differ past the range (some give NaN past 448 in e4m3, e5m2 gives inf); NaN stays NaN. The C++
writer (kernels/fused_ops.cpp's rope_store into fp8 caches, through cpu_math.h's narrow_fp8_row) clamps the same
fp32 values and converts with c10's same rounding, so both writers store the same bytes. e4m3 keeps 3 mantissa bits
(a relative rounding error up to 2^-4) over 2^-9 .. 448; e5m2 keeps 2 bits (2^-3) over 2^-16 .. 57344.
"""

from __future__ import annotations

import torch

FP8_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def to_fp8(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """x (any float dtype) -> fp8_dtype: clamped to its finite range in fp32, then rounded to nearest even."""
    finite = torch.finfo(fp8_dtype).max
    return x.float().clamp(-finite, finite).to(fp8_dtype)


def from_fp8(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 -> dtype (exact for bf16, fp16 and fp32)."""
    return q.to(dtype)
