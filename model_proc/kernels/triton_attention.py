"""Paged attention in Triton, for CUDA: K/V are read in place from the KV pool through each request's page list,
never gathered. Imported only where --attention-backend resolves to "triton" (model_proc/layers/attention.py),
as importing it imports triton; with TRITON_INTERPRET=1 set before the import, Triton's interpreter runs the same
kernels on CPU tensors (the parity tests).

Two kernels share one layer call, each over its own rows (attention_metadata.TritonRows):
  - decode, one query row per request (extend_len 1): one program per (row, KV head, split) attends the query
    heads of that KV head (GQA: the K/V block is loaded once for the group) over 1/num_splits of the keys, and
    keeps its output and log-sum-exp in fp32; a reduce program per (row, query head) weighs the splits together.
    Splitting keeps the GPU busy when a few requests have long contexts.
  - extend / prefill, several new tokens after a cached prefix (0 or more): one program per (block of new tokens,
    query head) walks the keys from the window's start to its last query's position, causal (new token i of a
    request, position cached + i, sees keys <= cached + i). The new tokens' K/V are already in the pool.

Both take the layer's options as PagedAttention means them: a sliding window W > 0 lets position p see keys
p - W + 1 .. p, and a logit softcap c > 0 turns each scaled score s into c * tanh(s / c) before the mask and the
softmax. Scores, softmax and accumulation are fp32; the probabilities are rounded to the V dtype before they
weight V (as torch's SDPA does in bf16), and the output is the query's dtype. fp32 dots run in IEEE fp32 (no TF32).
Under the interpreter, bf16 dot operands are widened to fp32 first (its tl.dot misreads bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

DECODE_BLOCK_N = 32  # keys per step of a decode program
EXTEND_BLOCK_N = 32  # keys per step of an extend program
MIN_GROUP_ROWS = 16  # tl.dot needs at least 16 rows: a decode program pads its query heads to this
NO_WINDOW = 1 << 30  # the window the kernels get for full attention: longer than any context


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    if WIDEN:  # bf16 products are exact in fp32: the same sums, up to their order
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _scores(q, k, scale, softcap, USE_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    s = _dot(q, tl.trans(k), DOT_PRECISION, WIDEN) * scale
    if USE_SOFTCAP:
        s = softcap * _tanh(s / softcap)
    return s


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr,
    decode_reqs_ptr, token_starts_ptr, cached_lens_ptr, page_starts_ptr, page_ids_ptr,
    stride_qt, stride_qh, stride_kh, stride_ks, stride_vh, stride_vs,
    scale, softcap, window, page_size, group, num_heads, head_dim,
    NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):  # fmt: skip
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    req = tl.load(decode_reqs_ptr + row)
    token = tl.load(token_starts_ptr + req).to(tl.int64)
    seq_len = tl.load(cached_lens_ptr + req) + 1
    page_start = tl.load(page_starts_ptr + req)
    lo = tl.maximum(seq_len - window, 0)  # the query, at seq_len - 1, sees lo .. seq_len - 1
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    stop = tl.minimum(start + per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    heads = kv_head * group + g
    d = tl.arange(0, BLOCK_D)
    head_ok, d_ok = g < group, d < head_dim
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=head_ok[:, None] & d_ok[None, :], other=0.0,
    )  # fmt: skip
    m = tl.full([BLOCK_G], -1e30, tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, stop, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < stop
        page = tl.load(page_ids_ptr + page_start + pos // page_size, mask=key_ok, other=0)
        slot = page.to(tl.int64) * page_size + pos % page_size
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_head * stride_kh + slot[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
        s = _scores(q, k, scale, softcap, USE_SOFTCAP, DOT_PRECISION, WIDEN)
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_head * stride_vh + slot[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, WIDEN)
        m = m_new

    denom_safe = tl.where(denom > 0, denom, 1.0)  # an empty split: output 0, log-sum-exp -inf (weight 0 in the reduce)
    lse = tl.where(denom > 0, m + tl.log(denom_safe), float("-inf"))
    at = (row * num_heads + heads) * NUM_SPLITS + split
    tl.store(part_lse_ptr + at, lse, mask=head_ok)
    out_mask = head_ok[:, None] & d_ok[None, :]
    tl.store(part_out_ptr + at[:, None] * head_dim + d[None, :], acc / denom_safe[:, None], mask=out_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, decode_reqs_ptr, token_starts_ptr,
    stride_ot, stride_oh, num_heads, head_dim,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row, head = tl.program_id(0), tl.program_id(1)
    token = tl.load(token_starts_ptr + tl.load(decode_reqs_ptr + row)).to(tl.int64)
    sp, d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    sp_ok, d_ok = sp < NUM_SPLITS, d < head_dim
    at = (row * num_heads + head) * NUM_SPLITS + sp
    lse = tl.load(part_lse_ptr + at, mask=sp_ok, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))  # the first split always holds keys: the max is finite
    o = tl.load(part_out_ptr + at[:, None] * head_dim + d[None, :], mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    block_reqs_ptr, block_starts_ptr, token_starts_ptr, cached_lens_ptr, extend_lens_ptr, page_starts_ptr, page_ids_ptr,
    stride_qt, stride_qh, stride_kh, stride_ks, stride_vh, stride_vs, stride_ot, stride_oh,
    scale, softcap, window, page_size, group, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):  # fmt: skip
    block, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // group
    req = tl.load(block_reqs_ptr + block)
    first = tl.load(block_starts_ptr + block)  # this block's first new token, within the request
    token_start = tl.load(token_starts_ptr + req).to(tl.int64)
    cached = tl.load(cached_lens_ptr + req)
    extend = tl.load(extend_lens_ptr + req)
    page_start = tl.load(page_starts_ptr + req)

    i = first + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_ok, d_ok = i < extend, d < head_dim
    q_pos = cached + i
    tokens = token_start + i
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # fmt: skip
    stop = cached + tl.minimum(first + BLOCK_M, extend)  # keys up to the block's last query
    lo = tl.maximum(cached + first - window + 1, 0)  # the first query's window start

    m = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a row whose keys are all masked in a block stays at 0
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, stop, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < stop
        page = tl.load(page_ids_ptr + page_start + pos // page_size, mask=key_ok, other=0)
        slot = page.to(tl.int64) * page_size + pos % page_size
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_head * stride_kh + slot[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
        s = _scores(q, k, scale, softcap, USE_SOFTCAP, DOT_PRECISION, WIDEN)
        sees = key_ok[None, :] & (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(sees, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_head * stride_vh + slot[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, WIDEN)
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + head * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )  # fmt: skip


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, *,
    token_starts: torch.Tensor, cached_lens: torch.Tensor, extend_lens: torch.Tensor, page_starts: torch.Tensor,
    page_ids: torch.Tensor, decode_reqs: torch.Tensor, num_splits: int, block_reqs: torch.Tensor,
    block_starts: torch.Tensor, block_tokens: int, page_size: int, scale: float, window: int, softcap: float,
) -> None:  # fmt: skip
    """Attention of the batch's new tokens, written into `out`. q and out [T, h, d] (head_dim contiguous), k_cache
    and v_cache [kvh, slots, d] (the pool's, slot = page * page_size + offset, the new tokens' K/V written); per
    request int32 token_starts, cached_lens, extend_lens, page_starts (into page_ids); decode_reqs: the requests
    with one new token; block_reqs / block_starts: the extend kernel's blocks of `block_tokens` new tokens."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    block_d = max(16, triton.next_power_of_2(head_dim))
    options = {
        "USE_SOFTCAP": softcap > 0,
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",  # tf32 only applies to fp32 inputs
        # Triton 3.9's interpreter reads bf16 dot operands as raw bits: widen them to fp32 there
        "WIDEN": isinstance(_extend_kernel, InterpretedFunction) and q.dtype == torch.bfloat16,
    }
    window_tokens = window if window > 0 else NO_WINDOW  # the kernels mask by the window only
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1))
    num_decode = decode_reqs.shape[0]
    if num_decode:
        part_out = torch.empty(num_decode, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_decode, num_heads, num_splits, dtype=torch.float32, device=q.device)
        _decode_split_kernel[(num_decode, num_kv_heads, num_splits)](
            q, k_cache, v_cache, part_out, part_lse, decode_reqs, token_starts, cached_lens, page_starts, page_ids,
            *strides, scale, softcap, window_tokens, page_size, group, num_heads, head_dim,
            NUM_SPLITS=num_splits, BLOCK_G=max(MIN_GROUP_ROWS, triton.next_power_of_2(group)), BLOCK_D=block_d,
            BLOCK_N=DECODE_BLOCK_N, **options,
        )  # fmt: skip
        _decode_reduce_kernel[(num_decode, num_heads)](
            out, part_out, part_lse, decode_reqs, token_starts, out.stride(0), out.stride(1), num_heads, head_dim,
            NUM_SPLITS=num_splits, BLOCK_S=max(2, triton.next_power_of_2(num_splits)), BLOCK_D=block_d,
        )  # fmt: skip
    if block_reqs.shape[0]:
        _extend_kernel[(block_reqs.shape[0], num_heads)](
            q, k_cache, v_cache, out, block_reqs, block_starts, token_starts, cached_lens, extend_lens, page_starts,
            page_ids, *strides, out.stride(0), out.stride(1), scale, softcap, window_tokens, page_size, group, head_dim,
            BLOCK_M=block_tokens, BLOCK_N=EXTEND_BLOCK_N, BLOCK_D=block_d, **options,
        )  # fmt: skip
