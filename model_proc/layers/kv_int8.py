"""The int8 KV cache's rows (--kv-cache-dtype int8): one symmetric scale per token and KV head, as
llama.cpp's q8_0 cache keeps one per block of 32 (in fp16: 34 bytes a block). A row x of head_dim values is stored as

    scale = bf16(max|x| / 127)  (to nearest even)        q = round(x * (1 / scale))  (int8, to nearest even, +-127)

and read back as q * scale: head_dim + 2 bytes a row, 2d / (d + 2) times the rows of a 16-bit cache in the same
memory (1.94x at d 64, 1.97x at d 128; an fp32 scale gave 1.88x / 1.94x). The C++ writer
(kernels/fused_ops.cpp's rope_store_int8, through cpu_math.h's quantize_int8_row_bf16_scale) computes the same fp32
operations, so both writers store the same bytes. The rounding error of a value is at most scale / 2, about
max|x| / 254 of its row (the scale's own rounding, 2^-9 of it at most, moves the grid, not the bound: the row's
largest value still rounds to 127).
"""

from __future__ import annotations

import torch

INT8_MAX = 127.0
SCALE_DTYPE = torch.bfloat16
SCALE_BYTES = 2  # per row (token, head): SCALE_DTYPE's itemsize


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] (any float dtype) -> (int8 [..., d], bf16 scales [...]); an all-zero row gets scale 0."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    # tensors divided by tensors: one rounding each, as C++'s amax / 127.0f and 1.0f / s (a number / tensor is a
    # reciprocal, then a product: two, and a row's tie at x.5 may round the other way)
    scale = (amax / torch.full_like(amax, INT8_MAX)).to(SCALE_DTYPE)
    s = scale.float()
    inv = torch.where(s > 0, torch.ones_like(s) / s, torch.zeros_like(s))
    q = torch.round(xf * inv[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., d] times bf16 scales [...] -> [..., d] in `dtype` (the product in fp32, then rounded to dtype)."""
    return (q.float() * scales.float()[..., None]).to(dtype)
