"""Request state, one class per stage of a request's life in the scheduler:

    submit -> PendingReq --admit--> Req (+ ChunkedReq while prompt is left) --finish/abort--> gone

`PendingReq` holds nothing. A `Req` holds a row of the ReqTable, KV pages and (maybe) a lock on a
radix-cache node; the Scheduler owns and mutates it. A request does no I/O and makes no policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.sampling_params import SamplingParams
from scheduler_proc.radix_cache import RadixNode


@dataclass(slots=True, eq=False)
class PendingReq:
    """A request waiting for admission: validated, clamped, seeded, holding no resources."""

    req_id: int
    input_ids: np.ndarray  # int32[num_prompt_tokens]
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int  # params.max_tokens clamped so that prompt + output fits the context
    seed: int
    stop_ids: frozenset[int]  # EOS ids (unless ignore_eos) and params.stop_token_ids
    max_tokens_clamped_to: int | None  # reported once, on the request's first update
    max_num_pages: int  # KV pages the request can ever need: ceil((prompt + max_tokens - 1) / page_size)


@dataclass(slots=True, eq=False)
class Req:
    """An admitted request. Its page table is preallocated to the most pages it can ever need:

        page_table  [ tree-owned (locked via cache_node) | own pages     | unused       ]
                    0                      num_tree_pages            num_pages   max_num_pages

    Tree-owned pages belong to the radix cache and are shared; own pages belong to this request
    alone and are freed or handed to the tree when it ends. `max_num_pages - num_pages` pages
    are reserved for it: the admission check promised them, so allocating them never fails.
    """

    req_id: int
    input_ids: np.ndarray
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int
    seed: int
    stop_ids: frozenset[int]
    max_tokens_clamped_to: int | None
    row_idx: int
    page_table: np.ndarray  # int32[max_num_pages]
    num_pages: int
    num_tree_pages: int
    cache_node: RadixNode  # the locked end of the tree-owned prefix (the root when none)
    cached_len: int  # tokens whose K/V are in the pool, counting only steps that have returned
    num_cached_tokens: int  # prompt tokens served by the radix cache at admission
    output_ids: list[int] = field(default_factory=list)
    in_flight: bool = False  # part of the batch the worker is running now
    is_aborted: bool = False  # aborted while in flight: on_result frees it and sends nothing

    @property
    def seq_len(self) -> int:
        return self.num_prompt_tokens + len(self.output_ids)

    @property
    def max_num_pages(self) -> int:
        return len(self.page_table)

    @property
    def num_reserved_pages(self) -> int:
        return len(self.page_table) - self.num_pages

    @property
    def is_prefilling(self) -> bool:
        return self.cached_len < self.num_prompt_tokens


@dataclass(slots=True, eq=False)
class ChunkedReq:
    """A Req whose prompt is not all prefilled after the step it was scheduled in. It is not
    sampled, and waits at the front of the pending list, keeping its row, pages and cache lock,
    so its next chunk goes before any newer request."""

    req: Req
