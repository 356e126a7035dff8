"""The arithmetic of kernels/paged_attention.cpp's int8 decode walk (kernels/int8_attention.h), in torch, for the
kernel's tests: each decode token's query row (times the softmax scale, in fp32) quantized to int8 as cpu_math.h's
quantize_int8_row does (the cache's rounding with the scale kept in fp32), exact integer dot products with the int8 keys, each score the product's float
times (query scale * key scale), the softmax in fp32 (its exponentials rounded to bf16 before they weight V when the
queries are bf16, as the kernel and torch's SDPA do) and the values their int8 codes times their scales.
"""

from __future__ import annotations

import numpy as np
import torch

from zserve.common.forward_batch import ForwardBatch
from zserve.model_proc.layers.kv_int8 import INT8_MAX


def quantize_query_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [d] fp32 -> (int8 [d], its fp32 scale): round(x * (127 / max|x|)) to nearest even, scale max|x| / 127, as
    cpu_math.h's quantize_int8_row (127 / max|x| one rounded division, as C++'s)."""
    amax = x.abs().amax()
    inv = torch.full_like(amax, INT8_MAX) / amax if amax > 0 else torch.zeros_like(amax)
    return torch.round(x * inv).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), amax / INT8_MAX


def int8_decode_reference(q: torch.Tensor, int8_cache: tuple[torch.Tensor, ...], batch: ForwardBatch, page_size: int,
                          window: int = 0, softcap: float = 0.0, scale: float = 0.125) -> dict[tuple[int, int], torch.Tensor]:
    """{(token, head): fp32 [head_dim] output} for every request of `batch` with one new token; `int8_cache` is
    (k_codes, v_codes, k_scales, v_scales) as the kernel takes them ([kvh, slots, d] and [kvh, slots])."""
    k_codes, v_codes, k_scales, v_scales = int8_cache
    group = q.shape[1] // k_codes.shape[0]
    outputs = {}
    token_starts = np.cumsum(batch.extend_lens) - batch.extend_lens
    page_starts = np.cumsum(batch.num_pages) - batch.num_pages
    for r in np.flatnonzero(batch.extend_lens == 1):
        num_keys, token = int(batch.cached_lens[r]) + 1, int(token_starts[r])
        pages = torch.from_numpy(batch.page_ids[page_starts[r] : page_starts[r] + batch.num_pages[r]].astype(np.int64))
        slots = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:num_keys]
        slots = slots[max(0, num_keys - window) :] if window > 0 else slots
        for head in range(q.shape[1]):
            kv = head // group
            codes, q_scale = quantize_query_row(q[token, head].float() * scale)
            dots = (k_codes[kv, slots].int() @ codes.int()).float()
            scores = dots * (q_scale * k_scales[kv, slots].float())
            if softcap > 0:
                scores = softcap * torch.tanh(scores / softcap)
            weights = torch.exp(scores - scores.max())
            total = weights.sum()
            if q.dtype == torch.bfloat16:
                weights = weights.bfloat16().float()
            values = v_codes[kv, slots].float() * v_scales[kv, slots].float()[:, None]
            outputs[(token, head)] = (weights @ values) / total
    return outputs
