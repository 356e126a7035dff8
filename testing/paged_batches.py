"""ForwardBatches over shuffled pages, for attention tests and benchmarks (no scheduler needed)."""

from __future__ import annotations

import numpy as np

from zserve.common.forward_batch import ForwardBatch, SamplingArrays


def shuffled_page_batch(
    rng: np.random.Generator, cached_lens: list[int], extend_lens: list[int], page_size: int, num_pages_total: int,
) -> ForwardBatch:
    """Greedy requests whose pages are a random draw from a pool of `num_pages_total` pages
    (zeros as input ids: attention tests write their own K/V)."""
    num_pages = np.array([-(-(c + e) // page_size) for c, e in zip(cached_lens, extend_lens, strict=True)], np.int32)
    assert int(num_pages.sum()) <= num_pages_total, "the pool is too small for these requests"
    page_ids = rng.permutation(num_pages_total)[: int(num_pages.sum())].astype(np.int32)
    n = len(cached_lens)
    return ForwardBatch(
        step_id=0,
        input_ids=np.zeros(sum(extend_lens), np.int32),
        cached_lens=np.array(cached_lens, np.int32),
        extend_lens=np.array(extend_lens, np.int32),
        page_ids=page_ids,
        num_pages=num_pages,
        is_sampled=np.ones(n, bool),
        return_logprob=np.zeros(n, bool),
        sampling=SamplingArrays.greedy(n),
    )


def drafted_decode_batch(
    rng: np.random.Generator, cached_lens: list[int], last_ids: list[int], drafts: list[list[int]], page_size: int,
    num_pages_total: int,
) -> ForwardBatch:
    """Greedy decoding rows with speculative drafts (ForwardBatch's Drafts paragraph): row i
    computes `last_ids[i]` (its last sampled token) then `drafts[i]` (none: a plain decode row),
    over shuffled pages like `shuffled_page_batch`."""
    batch = shuffled_page_batch(rng, cached_lens, [1 + len(d) for d in drafts], page_size, num_pages_total)
    batch.input_ids = np.array([t for last, d in zip(last_ids, drafts, strict=True) for t in (last, *d)], np.int32)
    batch.draft_lens = np.array([len(d) for d in drafts], np.int32)
    return batch
