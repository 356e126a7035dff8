"""Paged attention: write the new tokens' K/V to their slots, then attend causally over each
request's slots. The index work is in attention_metadata.py; this is the per-layer part.

Paths (`attention_backend` picks one per ModelRunner):
  - cpu_kernel (CPU, fp32/bf16, the default where model_proc/kernels/ builds): one C++ call for
    the whole batch (decode, chunks, cached-prefix and new prompts), walking each request's
    pages in place, OpenMP over requests x kv heads x blocks of 16 new tokens.
  - torch (CPU fallback, the test oracle, and CUDA without flash-attn or triton): decode rows batched over
    a padded page gather + mask, longer rows one SDPA call each. --attention-backend torch forces it.
  - flash-attn varlen (CUDA, fp16/bf16, flash_attn importable): one call for the whole batch over
    slot-gathered K/V; its causal mask is bottom-right aligned, which is what a cached prefix needs.
  - triton (CUDA, fp16/bf16/fp32, triton importable; auto's choice on CUDA where flash-attn is not):
    model_proc/kernels/triton_attention.py, a split-K decode kernel and an extend kernel that read
    each request's pages in place. Imported only when chosen; on a CPU device it runs only under
    Triton's interpreter (TRITON_INTERPRET=1, the tests), else --attention-backend triton is refused.

A layer with `sliding_window` W > 0 lets the token at position p see keys p - W + 1 .. p only
(transformers' sliding mask, `kv_idx > q_idx - W`, the same for Mistral, Qwen2 and Gemma 2/3).
Every page stays in the KV pool and the radix cache, so the window changes only what attention
reads: KV accounting, prefix hits and chunking are as for full attention. `logit_softcap` c > 0
turns each scaled score s into c * tanh(s / c) before the mask and softmax (Gemma 2).

With an int8 KV cache (--kv-cache-dtype int8, kv_pool.py) the fused rope/store writes int8 rows and
their scales (rope_store_int8), as KVPool.write does on the other paths; the CPU kernel reads them in
place (paged_attention_int8). The torch, flash-attn and Triton paths read them dequantized to the
model's dtype first (KVPool.read_pages / read_slots / dequantized: correct, not fast); a new prompt
on the torch path attends over its own unquantized K/V, as before. An fp8 KV cache (--kv-cache-dtype
fp8_e4m3 / fp8_e5m2, kv_fp8.py) goes through the same calls as a 16-bit one: rope_store and paged_attention
take fp8 caches (rows converted on the way in, widened on the way out), the other paths read them converted.
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F
from torch import nn

from zserve.common.kernel_choices import ATTENTION_BACKENDS
from zserve.model_proc.kernels.cpu_kernels import load_paged_attention
from zserve.model_proc.layers.attention_metadata import AttentionMetadata, PrefillRow, TritonRows
from zserve.model_proc.layers.rotary import apply_rotary


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and importlib.util.find_spec("flash_attn") is not None
    )


def triton_available() -> bool:
    """Whether triton is installed, without importing it (the import takes a while and is needed only when chosen)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """TRITON_INTERPRET=1: Triton's interpreter runs the kernels on CPU tensors (slowly; for tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def attention_backend(device: torch.device, dtype: torch.dtype, choice: str = "auto") -> str:
    """"flash_varlen", "triton", "cpu_kernel" or "torch", for AttentionMetadata.build. `choice` (a server's
    --attention-backend) is "auto", "torch" (force the pure-torch path), "kernel" (the CPU kernel; fail if it cannot
    load) or "triton" (the Triton kernels; CUDA, or the CPU under TRITON_INTERPRET=1). auto on CUDA: flash-attn where
    it imports (fp16/bf16), else Triton where it is installed, else torch."""
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend {choice!r}: expected one of {', '.join(ATTENTION_BACKENDS)}")
    if choice == "triton":
        if device.type != "cuda" and not (device.type == "cpu" and triton_interpreted()):
            raise ValueError(
                f"--attention-backend triton runs on CUDA, not {device} "
                "(TRITON_INTERPRET=1 runs it on the CPU, for tests)"
            )
        if not triton_available():
            raise RuntimeError("--attention-backend triton, but the triton package is not installed")
        return "triton"
    if flash_attn_available(device, dtype) and choice == "auto":
        return "flash_varlen"
    if device.type == "cuda" and choice == "auto" and triton_available():
        return "triton"
    if choice == "torch" or device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        if choice == "kernel":
            raise ValueError(
                f"--attention-backend kernel: the CPU kernel runs float32/bfloat16 on CPU, not {dtype} on {device}"
            )
        return "torch"
    if load_paged_attention() is not None:
        return "cpu_kernel"
    if choice == "kernel":
        raise RuntimeError(
            "--attention-backend kernel, but the CPU paged-attention kernel could not be built (see the log line above)"
        )
    return "torch"


class PagedAttention(nn.Module):
    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int, *,
        sliding_window: int = 0, logit_softcap: float = 0.0,
    ):  # fmt: skip
        super().__init__()
        assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
        if sliding_window < 0 or logit_softcap < 0:
            raise ValueError(f"sliding_window={sliding_window} and logit_softcap={logit_softcap} must be >= 0")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.layer_idx = scale, layer_idx
        self.sliding_window, self.logit_softcap = sliding_window, logit_softcap  # 0: full causal, no cap
        self.fused_rope = False  # use_cpu_kernels(): rotary + K/V write in one call with the kernel backend

    def use_cpu_kernels(self) -> None:
        self.fused_rope = True

    def forward_rotary(
        self, qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """qk [T, h + kvh, d] (q heads then k heads, before rotary), v [T, kvh, d], cos and
        sin_signed [T, 1, rotary_dim] (rotary.py) -> [T, h * d]: rotates q and k, writes K/V, attends."""
        h = self.num_heads
        if self.fused_rope and meta.kernel is not None:
            pool, layer = meta.kv_pool, self.layer_idx
            k_cache, v_cache = pool.k[layer], pool.v[layer]
            if pool.quantized:
                q = torch.ops.zserve.rope_store_int8(
                    qk, v, cos, sin, k_cache, v_cache, pool.k_scales[layer], pool.v_scales[layer], meta.out_slots, h
                )  # K/V written as int8 rows and their scales
            else:
                q = torch.ops.zserve.rope_store(qk, v, cos, sin, k_cache, v_cache, meta.out_slots, h)  # K/V written
            return self._kernel(q, k_cache, v_cache, meta)
        qk = apply_rotary(qk, cos, sin)  # q and k rotated together
        return self(qk[:, :h], qk[:, h:], v, meta)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, h, d], k and v [T, kvh, d] (this step's tokens) -> [T, h * d]"""
        pool, layer = meta.kv_pool, self.layer_idx
        pool.write(layer, meta.out_slots, k, v)
        k_cache, v_cache = pool.k[layer], pool.v[layer]  # [kvh, slots, d]
        if meta.varlen is not None:
            return self._varlen(q, meta)
        if meta.triton is not None:
            return self._triton(q, *pool.dequantized(layer), meta.triton, pool.page_size)
        if meta.kernel is not None:
            return self._kernel(q, k_cache, v_cache, meta)

        T = q.shape[0]
        decode, prefills = meta.decode, meta.prefills
        if decode is not None and decode.token_idx is None:
            return self._decode(q, meta)
        out = torch.empty(T, self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        if decode is not None:
            out.index_copy_(
                0, decode.token_idx, self._decode(q.index_select(0, decode.token_idx), meta)
            )
        for row in prefills:
            a, b = row.token_start, row.token_stop
            out[a:b] = self._prefill_row(q[a:b], k[a:b], v[a:b], row, meta)
        return out

    def _kernel(self, q, k_cache, v_cache, meta) -> torch.Tensor:
        rows, T, pool = meta.kernel, q.shape[0], meta.kv_pool
        out = torch.empty(q.shape, dtype=q.dtype)  # [T, h, d]
        index = (rows.token_starts, rows.extend_lens, rows.cached_lens, rows.page_starts, rows.page_ids)
        options = (pool.page_size, self.scale, self.sliding_window, self.logit_softcap)
        if pool.quantized:  # int8 rows read in place, each times its scale
            scales = (pool.k_scales[self.layer_idx], pool.v_scales[self.layer_idx])
            torch.ops.zserve.paged_attention_int8(q, k_cache, v_cache, *scales, out, *index, *options)
        else:
            torch.ops.zserve.paged_attention(q, k_cache, v_cache, out, *index, *options)
        return out.view(T, self.num_heads * self.head_dim)

    def _triton(self, q, k_cache, v_cache, rows: TritonRows, page_size: int) -> torch.Tensor:
        from zserve.model_proc.kernels.triton_attention import paged_attention  # imports triton: only when chosen

        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, h, d]
        paged_attention(
            q, k_cache, v_cache, out, token_starts=rows.token_starts, cached_lens=rows.cached_lens,
            extend_lens=rows.extend_lens, page_starts=rows.page_starts, page_ids=rows.page_ids,
            decode_reqs=rows.decode_reqs, num_splits=rows.num_splits, block_reqs=rows.block_reqs,
            block_starts=rows.block_starts, block_tokens=rows.block_tokens, page_size=page_size, scale=self.scale,
            window=self.sliding_window, softcap=self.logit_softcap,
        )  # fmt: skip
        return out.view(q.shape[0], self.num_heads * self.head_dim)

    def _decode(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [B, h, d], one token per row -> [B, h * d]"""
        rows, pool = meta.decode, meta.kv_pool
        B, kvh, d = rows.num_rows, self.num_kv_heads, self.head_dim
        # [kvh, B, group, d]: query heads sharing a kv head
        q = q.view(B, kvh, self.num_heads // kvh, d).transpose(0, 1)
        outs = []
        for chunk in rows.chunks:
            n = chunk.row_stop - chunk.row_start
            key_pages, value_pages = pool.read_pages(self.layer_idx, chunk.page_table)
            keys, values = key_pages.view(kvh, n, -1, d), value_pages.view(kvh, n, -1, d)  # [kvh, n, Lp, d]
            q_chunk = q[:, chunk.row_start : chunk.row_stop]
            outs.append(self._sdpa(q_chunk, keys, values, chunk.window_mask(self.sliding_window)))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [kvh, B, group, d]
        return out.transpose(0, 1).reshape(B, self.num_heads * d)

    def _prefill_row(self, q, k, v, row, meta) -> torch.Tensor:
        """One request's E new tokens: q [E, h, d], k, v [E, kvh, d] -> [E, h * d].

        SDPA gets 4-D inputs: with 3-D ones torch's CPU build skips its flash kernel (10x slower)."""
        q = q.transpose(0, 1)[None]  # [1, h, E, d]
        window, group = self._window_for(row), self.num_heads // self.num_kv_heads
        if row.cached_len == 0:
            keys, values = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, kvh, E, d]
            if window == 0 and self.logit_softcap == 0:
                out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.scale, enable_gqa=True)
                return out[0].transpose(0, 1).reshape(-1, self.num_heads * self.head_dim)  # [E, h * d]
        else:
            pool, seq_len = meta.kv_pool, row.cached_len + q.shape[2]
            key_pages, value_pages = pool.read_pages(self.layer_idx, row.page_ids)
            keys = key_pages.view(self.num_kv_heads, -1, self.head_dim)[:, :seq_len][None]  # [1, kvh, L, d]
            values = value_pages.view(self.num_kv_heads, -1, self.head_dim)[:, :seq_len][None]
        # with a mask, expanding kv heads beats enable_gqa on CPU
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)  # [1, h, L, d]
        out = self._sdpa(q, keys, values, row.window_mask(window, q.device))
        return out[0].transpose(0, 1).reshape(-1, self.num_heads * self.head_dim)  # [E, h * d]

    def _window_for(self, row: PrefillRow) -> int:
        """This layer's window where it masks anything in `row`, else 0 (full causal is the same)."""
        return self.sliding_window if 0 < self.sliding_window < row.cached_len + row.token_stop - row.token_start else 0

    def _sdpa(self, q, keys, values, mask: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T * scale [softcapped] + mask) v; q [..., h or group, Q, d], keys and values
        [..., same heads, L, d], mask bool (True: attend) or additive, broadcast to [..., Q, L]."""
        if self.logit_softcap == 0:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        # as transformers' eager Gemma 2 attention: cap in the input dtype, softmax in fp32
        cap = self.logit_softcap
        scores = torch.tanh(q @ keys.transpose(-1, -2) * self.scale / cap) * cap
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        return scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ values

    def _varlen(self, q, meta) -> torch.Tensor:
        from flash_attn import flash_attn_varlen_func  # guarded by flash_attn_available()

        rows = meta.varlen
        keys, values = meta.kv_pool.read_slots(self.layer_idx, rows.kv_slots)
        keys, values = keys.transpose(0, 1), values.transpose(0, 1)  # [sum(seq_lens), kvh, d]
        # flash-attn's window: query i sees keys [i - left, i + right], bottom-right aligned (2.3+);
        # softcap only when set, as flash-attn before 2.6 has no such argument
        options = {"window_size": (self.sliding_window - 1, 0)} if self.sliding_window else {}
        if self.logit_softcap:
            options["softcap"] = self.logit_softcap
        out = flash_attn_varlen_func(
            q.contiguous(), keys.contiguous(), values.contiguous(),
            rows.cu_seqlens_q, rows.cu_seqlens_k, rows.max_seqlen_q, rows.max_seqlen_k,
            softmax_scale=self.scale, causal=True, **options,
        )  # [T, h, d]
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
