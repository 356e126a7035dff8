"""The int8 KV cache's rows (--kv-cache-dtype int8): one symmetric scale per token and KV head, as
llama.cpp's q8_0 cache keeps one per block of 32. A row x of head_dim values is stored as

    q = round(x * (127 / max|x|))  (int8, to nearest even)      scale = max|x| / 127  (fp32)

and read back as q * scale. The C++ writer (kernels/fused_ops.cpp's rope_store_int8, through
cpu_math.h's quantize_int8_row) computes the same fp32 products, so both writers store the same
bytes. The rounding error of a value is at most scale / 2 = max|x| / 254 of its row.
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
SCALE_DTYPE = torch.float32
SCALE_BYTES = 4  # per row (token, head): SCALE_DTYPE's itemsize


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] (any float dtype) -> (int8 [..., d], fp32 scales [...]); an all-zero row gets scale 0."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    # a tensor divided by a tensor: one rounding, as C++'s 127.0f / amax (a number / tensor is a reciprocal, then
    # a product: two, and a row's tie at x.5 may round the other way)
    inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax, torch.zeros_like(amax))
    q = torch.round(xf * inv[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, amax / INT8_MAX


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., d] times fp32 scales [...] -> [..., d] in `dtype` (the product in fp32, then rounded to dtype)."""
    return (q.float() * scales[..., None]).to(dtype)
