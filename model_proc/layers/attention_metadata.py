"""Per-step index tensors for paged attention, computed once per batch and shared by every layer.

Tokens of a batch are packed request after request; request i owns tokens
[token_start_i, token_start_i + extend_len_i) and positions [cached_len_i, cached_len_i + extend_len_i):

    tokens     | r0: n n n n n | r1: n | r2: n n n | r3: n |
    positions    0 1 2 3 4       17      5 6 7       40          (r1, r3 decode; r2 a chunk after 5 cached)

Rows with extend_len == 1 (decode, or a 1-token chunk) are attended together: their pages are
gathered into a padded [kvh, rows, max_pages * page_size, d] tensor, masked past each row's
length. On CPU the rows go in chunks of about DECODE_CHUNK_BYTES of gathered K and V, so what
one chunk gathers is still in cache when attention reads it (at batch 64 x 256 tokens on
SmolLM2-135M this cut the attention time by a third); on CUDA, one chunk.
Longer rows each go through SDPA, over their own new K/V when nothing is cached (no gather), else
over the gathered pages with a bottom-right causal mask. On CUDA with flash-attn installed, every
row goes through one varlen call over slot-gathered K/V instead.

With the CPU kernel (backend "cpu_kernel", model_proc/kernels/), there is no gather and no
per-row loop: the whole batch (decodes, chunks, cached-prefix and new prompts) is one kernel call
over KernelRows, which walks each request's page list in place. New prompts go through it too:
it measured faster than SDPA is_causal over their own K/V (benchmarks/bench_attention.py).

With Triton (backend "triton", CUDA; model_proc/kernels/triton_attention.py) the K/V are read in place too: the
decode rows go to a split-K kernel, the longer rows to an extend kernel in blocks of TRITON_EXTEND_BLOCK new tokens
(TritonRows lists them, so no program runs past its request).

Sliding windows differ per layer while this metadata is shared: the torch path's rows build the
mask of a window on first use (`window_mask`) and keep it for the step's other layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from zserve.common.forward_batch import ForwardBatch
from zserve.model_proc.layers.kv_pool import KVPool

DECODE_CHUNK_BYTES = 8 << 20
TRITON_EXTEND_BLOCK = 32  # new tokens per program of the Triton extend kernel
TRITON_SPLIT_TOKENS = 256  # a Triton decode row is split in ranges of about this many keys ...
TRITON_MAX_SPLITS = 16  # ... into at most this many


@dataclass(slots=True)
class DecodeChunk:
    row_start: int
    row_stop: int
    page_table: torch.Tensor  # int64[rows * max_pages], padded with page 0 (masked out)
    mask: torch.Tensor  # [1, rows, 1, max_pages * page_size] additive: 0 where j < seq_len, -inf after
    seq_lens: torch.Tensor  # int64[rows]
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # window -> mask, built on first use

    def window_mask(self, window: int) -> torch.Tensor:
        """`mask`, with -inf also where j < seq_len - window (the key is older than the window)."""
        if window == 0:
            return self.mask
        if window not in self.window_masks:
            key_pos = torch.arange(self.mask.shape[-1], device=self.mask.device)
            too_old = key_pos[None, :] < (self.seq_lens - window)[:, None]  # [rows, L]
            self.window_masks[window] = self.mask.masked_fill(too_old[None, :, None, :], float("-inf"))
        return self.window_masks[window]


@dataclass(slots=True)
class DecodeRows:
    num_rows: int
    token_idx: torch.Tensor | None  # int64[B] into the batch's tokens; None when the batch is only these rows, in order
    chunks: list[DecodeChunk]


@dataclass(slots=True)
class PrefillRow:
    token_start: int
    token_stop: int
    cached_len: int
    page_ids: torch.Tensor | None  # int64[num_pages] when cached_len > 0: the prefix is read from the pool
    mask: torch.Tensor | None  # bool[extend_len, cached_len + extend_len] when cached_len > 0
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # window -> mask, built on first use

    def window_mask(self, window: int, device: torch.device) -> torch.Tensor:
        """bool[extend_len, cached_len + extend_len]: query i (position c + i) sees key j where
        c + i - window < j <= c + i (window 0: every j <= c + i)."""
        if window == 0 and self.mask is not None:
            return self.mask
        if window not in self.window_masks:
            c, e = self.cached_len, self.token_stop - self.token_start
            key_pos = torch.arange(c + e, device=device)[None, :]
            query_pos = torch.arange(c, c + e, device=device)[:, None]
            mask = key_pos <= query_pos
            if window > 0:
                mask &= key_pos > query_pos - window
            self.window_masks[window] = mask
        return self.window_masks[window]


@dataclass(slots=True)
class VarlenRows:
    """flash-attn varlen inputs: every request, K/V gathered slot by slot."""

    cu_seqlens_q: torch.Tensor  # int32[num_reqs + 1]
    cu_seqlens_k: torch.Tensor  # int32[num_reqs + 1]
    max_seqlen_q: int
    max_seqlen_k: int
    kv_slots: torch.Tensor  # int64[sum(seq_lens)]


@dataclass(slots=True)
class KernelRows:
    """Every request of the batch for the CPU kernel, each int64[R]: it attends token t of request
    r (position cached_lens[r] + t) over positions 0 .. cached_lens[r] + t, read from the pages
    page_ids[page_starts[r]:]."""

    token_starts: torch.Tensor
    extend_lens: torch.Tensor
    cached_lens: torch.Tensor
    page_starts: torch.Tensor
    page_ids: torch.Tensor  # int64: the batch's page ids, request after request


@dataclass(slots=True)
class TritonRows:
    """The Triton kernels' inputs, int32 on the device. Per request, as KernelRows: token_starts, cached_lens,
    extend_lens, page_starts (into page_ids). decode_reqs: the requests with one new token, each split into
    `num_splits` ranges of keys; block_reqs / block_starts: the extend kernel's blocks, (request, its first new
    token), `block_tokens` new tokens each, for the requests with more than one."""

    token_starts: torch.Tensor
    cached_lens: torch.Tensor
    extend_lens: torch.Tensor
    page_starts: torch.Tensor
    page_ids: torch.Tensor
    decode_reqs: torch.Tensor
    num_splits: int
    block_reqs: torch.Tensor
    block_starts: torch.Tensor
    block_tokens: int


@dataclass(slots=True)
class AttentionMetadata:
    kv_pool: KVPool
    positions: torch.Tensor  # int64[T]
    out_slots: torch.Tensor  # int64[T]: where each new token's K/V is written
    decode: DecodeRows | None
    prefills: list[PrefillRow]
    varlen: VarlenRows | None  # set only when the flash-attn path runs
    kernel: KernelRows | None = None  # set only when the CPU kernel runs
    # int64[T]: each token's request length after this step (cached + extend), for RoPE types that depend on it
    seq_lens_by_token: torch.Tensor | None = None
    triton: TritonRows | None = None  # set only when the Triton kernels run

    @staticmethod
    def build(batch: ForwardBatch, kv_pool: KVPool, dtype: torch.dtype, backend: str = "torch") -> AttentionMetadata:
        """backend: "torch", "flash_varlen", "cpu_kernel" or "triton" (see attention.attention_backend)."""
        device, page_size = kv_pool.device, kv_pool.page_size
        cached = batch.cached_lens.astype(np.int64)
        extend = batch.extend_lens.astype(np.int64)
        seq_lens = cached + extend
        token_starts = np.cumsum(extend) - extend
        page_starts = np.cumsum(batch.num_pages.astype(np.int64)) - batch.num_pages
        page_ids = batch.page_ids.astype(np.int64)

        req_of_token = np.repeat(np.arange(batch.num_reqs), extend)
        positions = cached[req_of_token] + np.arange(batch.num_tokens) - token_starts[req_of_token]
        out_slots = page_ids[page_starts[req_of_token] + positions // page_size] * page_size + positions % page_size

        def to_device(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device, non_blocking=True)

        seq_lens_by_token = to_device(seq_lens[req_of_token])
        if backend == "flash_varlen":
            return AttentionMetadata(
                kv_pool, to_device(positions), to_device(out_slots), None, [],
                _varlen(batch, seq_lens, page_starts, page_ids, page_size, to_device),
                seq_lens_by_token=seq_lens_by_token,
            )
        if backend == "cpu_kernel":
            kernel = _kernel_rows(cached, extend, token_starts, page_starts, page_ids, to_device)
            return AttentionMetadata(
                kv_pool, to_device(positions), to_device(out_slots), None, [], None, kernel, seq_lens_by_token
            )
        if backend == "triton":
            triton_rows = _triton_rows(cached, extend, token_starts, page_starts, page_ids, to_device)
            return AttentionMetadata(
                kv_pool, to_device(positions), to_device(out_slots), None, [], None, None, seq_lens_by_token,
                triton_rows,
            )
        is_decode = extend == 1
        decode = _decode_rows(
            batch, is_decode, seq_lens, token_starts, page_starts, page_ids, kv_pool, dtype, to_device
        )
        prefills = []
        for i in np.nonzero(~is_decode)[0]:
            start, c, e = int(token_starts[i]), int(cached[i]), int(extend[i])
            row_pages, mask = None, None
            if c > 0:
                row_pages = to_device(page_ids[page_starts[i] : page_starts[i] + batch.num_pages[i]])
                # query i (position c + i) sees keys 0..c + i
                mask = torch.arange(c + e, device=device)[None, :] <= torch.arange(c, c + e, device=device)[:, None]
            prefills.append(PrefillRow(start, start + e, c, row_pages, mask))
        return AttentionMetadata(
            kv_pool, to_device(positions), to_device(out_slots), decode, prefills, None, None, seq_lens_by_token
        )


def _kernel_rows(cached, extend, token_starts, page_starts, page_ids, to_device) -> KernelRows:
    return KernelRows(
        token_starts=to_device(token_starts),
        extend_lens=to_device(extend),
        cached_lens=to_device(cached),
        page_starts=to_device(page_starts.astype(np.int64)),
        page_ids=to_device(page_ids),
    )


def _triton_rows(cached, extend, token_starts, page_starts, page_ids, to_device) -> TritonRows:
    def int32(a: np.ndarray) -> torch.Tensor:
        return to_device(np.ascontiguousarray(a, dtype=np.int32))

    decode_reqs = np.nonzero(extend == 1)[0]
    longest = int(cached[decode_reqs].max()) + 1 if decode_reqs.size else 1
    num_splits = min(TRITON_MAX_SPLITS, -(-longest // TRITON_SPLIT_TOKENS))
    extend_reqs = np.nonzero(extend > 1)[0]
    blocks_per_req = -(-extend[extend_reqs] // TRITON_EXTEND_BLOCK)
    block_reqs = np.repeat(extend_reqs, blocks_per_req)
    block_starts = (np.arange(block_reqs.size) - np.repeat(np.cumsum(blocks_per_req) - blocks_per_req, blocks_per_req))
    return TritonRows(
        token_starts=int32(token_starts), cached_lens=int32(cached), extend_lens=int32(extend),
        page_starts=int32(page_starts), page_ids=int32(page_ids), decode_reqs=int32(decode_reqs),
        num_splits=num_splits, block_reqs=int32(block_reqs), block_starts=int32(block_starts * TRITON_EXTEND_BLOCK),
        block_tokens=TRITON_EXTEND_BLOCK,
    )  # fmt: skip


def _decode_rows(
    batch, is_decode, seq_lens, token_starts, page_starts, page_ids, kv_pool, dtype, to_device
) -> DecodeRows | None:
    rows = np.nonzero(is_decode)[0]
    if rows.size == 0:
        return None
    page_size = kv_pool.page_size
    num_pages = batch.num_pages[rows].astype(np.int64)
    max_pages = int(num_pages.max())
    # table[b, j] = page_ids[page_starts[row b] + j] for j < num_pages[b], else page 0
    table = np.zeros((rows.size, max_pages), np.int64)
    col = np.arange(max_pages)[None, :]
    valid = col < num_pages[:, None]
    table[valid] = page_ids[(page_starts[rows][:, None] + col)[valid]]
    mask = np.where(np.arange(max_pages * page_size)[None, :] < seq_lens[rows][:, None], 0.0, -np.inf)
    table_t, mask_t = to_device(table.reshape(-1)), to_device(mask.astype(np.float32)).to(dtype)[None, :, None, :]
    gathered_bytes_per_row = 2 * kv_pool.num_kv_heads * max_pages * page_size * kv_pool.head_dim * dtype.itemsize
    chunk_rows = rows.size if kv_pool.device.type == "cuda" else max(1, DECODE_CHUNK_BYTES // gathered_bytes_per_row)
    row_lens = to_device(seq_lens[rows])
    chunks = [
        DecodeChunk(
            start, stop, table_t[start * max_pages : stop * max_pages], mask_t[:, start:stop], row_lens[start:stop]
        )
        for start, stop in ((s, min(s + chunk_rows, rows.size)) for s in range(0, rows.size, chunk_rows))
    ]
    only_these = rows.size == batch.num_reqs
    return DecodeRows(
        num_rows=int(rows.size), token_idx=None if only_these else to_device(token_starts[rows]), chunks=chunks
    )


def _varlen(batch, seq_lens, page_starts, page_ids, page_size, to_device) -> VarlenRows:
    extend = batch.extend_lens.astype(np.int64)
    req_of_key = np.repeat(np.arange(batch.num_reqs), seq_lens)
    key_pos = np.arange(int(seq_lens.sum())) - (np.cumsum(seq_lens) - seq_lens)[req_of_key]
    kv_slots = page_ids[page_starts[req_of_key] + key_pos // page_size] * page_size + key_pos % page_size
    zero = np.zeros(1, np.int64)
    return VarlenRows(
        cu_seqlens_q=to_device(np.concatenate([zero, np.cumsum(extend)]).astype(np.int32)),
        cu_seqlens_k=to_device(np.concatenate([zero, np.cumsum(seq_lens)]).astype(np.int32)),
        max_seqlen_q=int(extend.max()),
        max_seqlen_k=int(seq_lens.max()),
        kv_slots=to_device(kv_slots),
    )
