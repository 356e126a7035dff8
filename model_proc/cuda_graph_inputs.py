"""CudaGraphInputs: the static input buffers of one captured decode bucket, and how a ForwardBatch is copied in.

A captured graph reads the same addresses at every replay, so each bucket owns its inputs at a fixed size:

    input_ids, positions, out_slots, seq_lens   int64[bucket]        one token a row
    cached_lens                                  int32[bucket]
    page_ids                                     int32[bucket * max_pages]: row r's table at r * max_pages
    token_starts, decode_reqs, extend_lens, page_starts   int32[bucket], fixed at capture (arange, ones, ...)

A batch of n <= bucket rows fills rows 0..n-1; rows n.. are padding: token 0 at position 0 of the scratch page (a
page the scheduler is never given, ModelRunner.num_pages_total), so their K/V write lands there and their attention
reads only it; their logits are dropped (`rows_of` slices the first n). A real row's table is padded with the
scratch page too (never read: the kernels stop at the row's length).

The attention metadata over these buffers is the Triton backend's (TritonRows) with a fixed split count,
TRITON_MAX_SPLITS: the decode kernel sizes each split from the row's length, and an empty split weighs nothing.
`host_arrays` is the device-free part (numpy), tested on the CPU; `fill` copies it into the buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zserve.common.forward_batch import ForwardBatch
from zserve.model_proc.layers.attention_metadata import TRITON_MAX_SPLITS, AttentionMetadata, TritonRows
from zserve.model_proc.layers.kv_pool import KVPool


@dataclass(frozen=True, slots=True)
class PaddedDecode:
    """One batch's inputs padded to a bucket, on the host (what `fill` copies)."""

    input_ids: np.ndarray  # int64[bucket]
    positions: np.ndarray  # int64[bucket]
    out_slots: np.ndarray  # int64[bucket]
    seq_lens: np.ndarray  # int64[bucket]
    cached_lens: np.ndarray  # int32[bucket]
    page_ids: np.ndarray  # int32[bucket * max_pages]


def host_arrays(batch: ForwardBatch, bucket: int, max_pages: int, page_size: int, scratch_page: int) -> PaddedDecode:
    """`batch` (a plain decode step, n <= bucket rows, each within max_pages pages) padded to `bucket` rows."""
    n = batch.num_reqs
    if n > bucket or not batch.is_decode_only:
        raise ValueError(f"ForwardBatch {batch.step_id}: {n} rows do not replay in the decode bucket of {bucket}")
    if int(batch.num_pages.max()) > max_pages:
        raise ValueError(f"ForwardBatch {batch.step_id}: a row has more than the {max_pages} pages a table holds")
    cached = np.zeros(bucket, np.int64)
    cached[:n] = batch.cached_lens
    table = np.full((bucket, max_pages), scratch_page, np.int32)
    page_starts = np.cumsum(batch.num_pages, dtype=np.int64) - batch.num_pages
    col = np.arange(max_pages)[None, :]
    valid = col < batch.num_pages[:, None]
    table[:n][valid] = batch.page_ids[(page_starts[:, None] + col)[valid]]
    # the one new token of row r sits at position cached[r]; a padding row's, at 0 of the scratch page
    out_slots = table[np.arange(bucket), cached // page_size].astype(np.int64) * page_size + cached % page_size
    input_ids = np.zeros(bucket, np.int64)
    input_ids[:n] = batch.input_ids
    return PaddedDecode(
        input_ids=input_ids, positions=cached, out_slots=out_slots, seq_lens=cached + 1,
        cached_lens=cached.astype(np.int32), page_ids=table.reshape(-1),
    )  # fmt: skip


class CudaGraphInputs:
    def __init__(self, bucket: int, max_pages: int, page_size: int, scratch_page: int, device: torch.device):
        """Buffers for `bucket` rows of at most `max_pages` pages each (the model's context), on `device`."""
        self.bucket, self.max_pages, self.page_size, self.scratch_page = bucket, max_pages, page_size, scratch_page
        rows = torch.arange(bucket, dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(bucket, dtype=torch.int64, device=device)
        self.positions = torch.zeros(bucket, dtype=torch.int64, device=device)
        self.out_slots = torch.zeros(bucket, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(bucket, dtype=torch.int64, device=device)
        self.cached_lens = torch.zeros(bucket, dtype=torch.int32, device=device)
        self.page_ids = torch.full((bucket * max_pages,), scratch_page, dtype=torch.int32, device=device)
        self.token_starts, self.decode_reqs = rows, rows  # one token a row: row r's token is token r
        self.extend_lens = torch.ones(bucket, dtype=torch.int32, device=device)
        self.page_starts = rows * max_pages
        self.no_blocks = torch.zeros(0, dtype=torch.int32, device=device)  # no extend rows in a decode step
        self.fill_padding()

    def fill_padding(self) -> None:
        """Every row a padding row (what the warmup and the capture run: they write only the scratch page)."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.out_slots.fill_(self.scratch_page * self.page_size)
        self.seq_lens.fill_(1)
        self.cached_lens.zero_()
        self.page_ids.fill_(self.scratch_page)

    def fill(self, batch: ForwardBatch) -> None:
        """Copy `batch` into the buffers, padded (host_arrays)."""
        padded = host_arrays(batch, self.bucket, self.max_pages, self.page_size, self.scratch_page)
        for name in ("input_ids", "positions", "out_slots", "seq_lens", "cached_lens", "page_ids"):
            getattr(self, name).copy_(torch.from_numpy(getattr(padded, name)), non_blocking=True)

    def metadata(self, kv_pool: KVPool) -> AttentionMetadata:
        """The attention metadata the graph is captured with: every tensor one of these buffers."""
        rows = TritonRows(
            token_starts=self.token_starts, cached_lens=self.cached_lens, extend_lens=self.extend_lens,
            page_starts=self.page_starts, page_ids=self.page_ids, decode_reqs=self.decode_reqs,
            num_splits=TRITON_MAX_SPLITS, block_reqs=self.no_blocks, block_starts=self.no_blocks, block_tokens=1,
        )  # fmt: skip
        return AttentionMetadata(
            kv_pool, self.positions, self.out_slots, None, [], None, None, self.seq_lens, rows
        )

    @staticmethod
    def rows_of(output: torch.Tensor, num_rows: int) -> torch.Tensor:
        """The real rows of a bucket-sized output: padding rows dropped."""
        return output[:num_rows]
