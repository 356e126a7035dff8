"""A stand-in for flash-attn's `flash_attn_varlen_func` on CPU, written from its documented
contract, so the varlen path's arguments are tested where flash-attn cannot be installed:

    queries and keys of sequence i are rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] (and _k); with
    causal=True the mask is aligned to the bottom-right; with window_size=(left, right) != (-1, -1)
    query i sees keys in [i + Lk - Lq - left, i + Lk - Lq + right]; softcap > 0 caps the scaled
    scores at softcap * tanh(score / softcap); kv heads are shared by h / kvh query heads each.

Use: `monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn)`. It takes no arguments
beyond those, so a call with another name fails as it would on an old flash-attn.
"""

from __future__ import annotations

import torch


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
    causal=False, window_size=(-1, -1), softcap=0.0,
):  # fmt: skip
    assert dropout_p == 0.0
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    for i in range(len(cu_seqlens_q) - 1):
        qa, qb, ka, kb = (int(x) for x in (cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]))
        assert qb - qa <= max_seqlen_q and kb - ka <= max_seqlen_k
        queries = q[qa:qb].float().transpose(0, 1)  # [h, Lq, d]
        keys = k[ka:kb].float().repeat_interleave(group, 1).transpose(0, 1)
        values = v[ka:kb].float().repeat_interleave(group, 1).transpose(0, 1)
        scores = queries @ keys.transpose(1, 2) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        query_pos = torch.arange(qb - qa)[:, None] + (kb - ka) - (qb - qa)
        key_pos = torch.arange(kb - ka)[None, :]
        allowed = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
        if causal:
            allowed &= key_pos <= query_pos
        left, right = window_size
        if left >= 0:
            allowed &= key_pos >= query_pos - left
        if right >= 0:
            allowed &= key_pos <= query_pos + right
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[qa:qb] = (scores.softmax(-1) @ values).transpose(0, 1).to(q.dtype)
    return out
