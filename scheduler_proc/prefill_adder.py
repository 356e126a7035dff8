"""PrefillAdder: the prefill part of one step, built under a token budget and a KV reservation.

Made fresh every step (a budget lives as long as the step it limits):

    adder = PrefillAdder(token_budget=..., reserved_size=..., reservation=..., ...)
    adder.add_chunked(chunked)            # the ChunkedReq left by the last step, first
    adder.try_add(pending) ...            # in the admission policy's order

A request is admitted only if what the KvReservation reserves for it (its uncached prompt, plus
its output: all of max_tokens under `full`, an estimate under `estimated`; in whole pages) fits
in free + evictable KV on top of `reserved_size`, what it reserves for the requests already
admitted. Under `full` running requests never wait for memory and are never retracted.

Identical prompts in one round are computed once: a request whose whole prompt equals that of a
request this step completes, with the same cached prefix, takes its K/V from that one (its *KV
source*, `kv_source`). It gets its own row, pages and reservation like any request, and counts
towards the request cap, but costs no token budget: the worker copies the source's K/V of this
step into its pages, and it samples from the source's logits. A prompt that shares only a prefix with one in
this step waits for that page instead (WAIT_FOR_PREFIX): next step it is a cache hit.
"""

from __future__ import annotations

import enum
import logging

import numpy as np

from zserve.common.int_math import cdiv
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.kv_reservation import KvReservation
from zserve.scheduler_proc.req import ChunkedReq, PendingReq, PromptScores, Req
from zserve.scheduler_proc.req_table import ReqTable

logger = logging.getLogger(__name__)


class AddOutcome(enum.Enum):
    ADMITTED = "admitted"
    NO_BUDGET = "no token budget left this step"
    REQUEST_CAP = "this step admitted as many requests as the per-round cap allows"
    NO_ROW = "all request rows are taken"
    NO_MEMORY = "not enough free or evictable KV for its prompt and reserved output"
    WAIT_FOR_PREFIX = "its next prefix page is being computed by a request in this step"


class PrefillAdder:
    def __init__(
        self,
        *,
        token_budget: int,
        reserved_size: int,
        reservation: KvReservation,
        cache: CacheManager,
        req_table: ReqTable,
        max_new_reqs: int | None = None,
        next_admit_seq: int = 0,
        wait_for_shared_prefix: bool = True,
    ):
        self.token_budget = token_budget  # tokens this step may still compute
        self.reserved_size = reserved_size  # KV tokens promised to admitted requests, not yet allocated
        self.reservation = reservation
        self.cache = cache
        self.req_table = req_table
        self.max_new_reqs = max_new_reqs  # newly admitted requests this step may take (None: no cap)
        self.next_admit_seq = next_admit_seq  # for the next first admission
        self.page_size = cache.page_size
        self.wait_for_shared_prefix = wait_for_shared_prefix and cache.enable_radix_cache
        self.reqs: list[Req] = []  # scheduled this step, in order
        self.extend_lens: list[int] = []
        # per entry of `reqs`: the index in `reqs` of its KV source, if it has one
        self.kv_source: list[int | None] = []
        # (adapter, prompt bytes) -> index in `reqs` of the request completing it now
        self._sources: dict[tuple[int, bytes], int] = {}
        self.admitted: list[Req] = []  # the newly admitted subset of `reqs`
        self.chunked: ChunkedReq | None = None  # the request left with prompt after this step

    def add_chunked(self, chunked: ChunkedReq) -> None:
        """Continue the previous step's ChunkedReq: its row, pages and lock are already held."""
        assert not self.reqs, "a ChunkedReq continues before anything else"
        req = chunked.req
        self._schedule(req, min(self.token_budget, req.num_prompt_tokens - req.cached_len))

    def try_add(self, pending: PendingReq) -> AddOutcome:
        # prompt logprobs need every prompt token's logits: computed whole (no prefix hit, no KV source), until they
        # are sent with the first output token (a ChunkedReq retracted mid-prompt scores it all again)
        scores_prompt = pending.params.prompt_logprobs is not None and not pending.output_ids
        source_idx = self._sources.get(_source_key(pending)) if self._sources and not scores_prompt else None
        if self.token_budget <= 0 and source_idx is None:
            return AddOutcome.NO_BUDGET
        if self.max_new_reqs is not None and len(self.admitted) >= self.max_new_reqs:
            return AddOutcome.REQUEST_CAP
        if self.req_table.num_free_rows == 0:
            return AddOutcome.NO_ROW
        num_prompt_tokens = pending.num_prompt_tokens
        # At least one prompt token is computed: its logits give the first output token.
        max_num_hit_pages = (
            (num_prompt_tokens - 1) // self.page_size if self.cache.enable_radix_cache and not scores_prompt else 0
        )
        if not self._fits(self._num_need_pages(pending, max_num_hit_pages)):
            return AddOutcome.NO_MEMORY  # even a full prefix hit would not fit: skip the match
        match = self.cache.match_prefix(
            pending.input_ids, 0 if scores_prompt else num_prompt_tokens - 1, pending.lora_idx,
        )
        if source_idx is not None and self.reqs[source_idx].cached_len != match.num_tokens:
            source_idx = None  # a ChunkedReq's last chunk that started mid-page: not the same computation
            if self.token_budget <= 0:
                return AddOutcome.NO_BUDGET
        if source_idx is None and not scores_prompt and self._prefix_in_this_step(pending, match.num_tokens):
            return AddOutcome.WAIT_FOR_PREFIX
        num_need_pages = self._num_need_pages(pending, len(match.page_ids))
        if not self._fits(num_need_pages):
            return AddOutcome.NO_MEMORY
        self.cache.lock(match.node)  # the matched pages stop being evictable: check again
        if not self._fits(num_need_pages):
            self.cache.unlock(match.node)
            return AddOutcome.NO_MEMORY

        row_idx = self.req_table.alloc(pending.req_id, pending.params, pending.seed)
        assert row_idx is not None
        page_table = np.empty(pending.max_num_pages, np.int32)
        num_matched_pages = len(match.page_ids)
        page_table[:num_matched_pages] = match.page_ids
        is_retracted = pending.is_retracted
        if not is_retracted:
            self.next_admit_seq += 1
        req = Req(
            req_id=pending.req_id,
            input_ids=pending.input_ids,
            num_prompt_tokens=num_prompt_tokens,
            num_orig_prompt_tokens=pending.num_orig_prompt_tokens,
            params=pending.params,
            max_tokens=pending.max_tokens,
            seed=pending.seed,
            stop_ids=pending.stop_ids,
            row_idx=row_idx,
            page_table=page_table,
            num_pages=num_matched_pages,
            num_tree_pages=num_matched_pages,
            cache_node=match.node,
            cached_len=match.num_tokens,
            num_cached_tokens=match.num_tokens if pending.num_cached_tokens is None else pending.num_cached_tokens,
            admit_seq=pending.admit_seq if is_retracted else self.next_admit_seq - 1,
            output_ids=list(pending.output_ids),
            prompt_scores=PromptScores(pending.params.prompt_logprobs) if scores_prompt else None,
            lora_idx=pending.lora_idx,
        )
        self.reserved_size += num_need_pages * self.page_size
        if source_idx is None:
            extend_len, how = min(self.token_budget, num_prompt_tokens - match.num_tokens), "computed"
        else:
            extend_len, how = self.extend_lens[source_idx], f"K/V shared from req {self.reqs[source_idx].req_id}"
        logger.info(
            "req %d %s: %d prompt tokens, %d cached, %d %s now, row %d",
            req.req_id, "re-admitted after a retraction" if is_retracted else "admitted",
            num_prompt_tokens, match.num_tokens, extend_len, how, row_idx,
        )
        self.admitted.append(req)
        self._schedule(req, extend_len, source_idx)
        return AddOutcome.ADMITTED

    # -- internals ---------------------------------------------------------------------------

    def _num_need_pages(self, pending: PendingReq, num_hit_pages: int) -> int:
        """Pages to reserve for `pending` if its first `num_hit_pages` pages are a prefix hit."""
        return self.reservation.num_pages(
            num_prompt_tokens=pending.num_prompt_tokens, num_kv_tokens=pending.num_kv_tokens,
            cached_len=num_hit_pages * self.page_size, num_pages=num_hit_pages,
        )

    def _fits(self, num_need_pages: int) -> bool:
        return num_need_pages * self.page_size + self.reserved_size <= self.cache.num_available_pages * self.page_size

    def _schedule(self, req: Req, extend_len: int, source_idx: int | None = None) -> None:
        """Compute `extend_len` more prompt tokens of `req` this step (or, with a KV source, take
        them from `reqs[source_idx]` at no budget); give it the pages they need out of its reservation."""
        end = req.cached_len + extend_len
        num_new_pages = cdiv(end, self.page_size) - req.num_pages
        if num_new_pages > 0:
            req.page_table[req.num_pages : req.num_pages + num_new_pages] = self.cache.alloc(num_new_pages)
            req.num_pages += num_new_pages
            self.reserved_size -= num_new_pages * self.page_size
        self.reqs.append(req)
        self.extend_lens.append(extend_len)
        self.kv_source.append(source_idx)
        if source_idx is not None:
            assert end == req.num_prompt_tokens and req.cached_len == self.reqs[source_idx].cached_len
            return
        assert 0 < extend_len <= self.token_budget, (extend_len, self.token_budget)
        self.token_budget -= extend_len
        if end < req.num_prompt_tokens:
            assert self.token_budget == 0
            self.chunked = ChunkedReq(req)
            logger.info(
                "req %d chunked: %d of %d prompt tokens after this step", req.req_id, end, req.num_prompt_tokens
            )
        elif req.prompt_scores is None:  # its prompt completes now: an identical one admitted after it shares its K/V
            self._sources.setdefault(_source_key(req), len(self.reqs) - 1)

    def _prefix_in_this_step(self, pending: PendingReq, num_matched_tokens: int) -> bool:
        """True if the page after the cached prefix is computed in this step by a request with
        the same tokens up to there. Waiting one step turns it into a cache hit, so a prefix
        shared by prompts arriving together is computed once instead of once each."""
        end = num_matched_tokens + self.page_size
        if not self.wait_for_shared_prefix or end > pending.num_prompt_tokens - 1:
            return False
        head = pending.input_ids[:end]
        return any(
            r.lora_idx == pending.lora_idx and r.num_prompt_tokens >= end and np.array_equal(r.input_ids[:end], head)
            for r in self.reqs
        )


def _source_key(req: PendingReq | Req) -> tuple[int, bytes]:
    """Requests share K/V only for the same prompt under the same LoRA adapter (or none)."""
    return req.lora_idx, req.input_ids.tobytes()
