"""SpeculativeReqs: speculative decoding's part of the scheduler core (`--speculative-algorithm`),
the owner of every request's drafting state, called by the Scheduler alone:

    step      plan: the decode rows' drafts (`Req.drafts`) and the pages for them
    result    verified: a drafted row's accepted drafts, counted; the back-off sees them
    end       release: a finish or an abort drops the request's drafting state (a retracted
              request keeps it: its sequence goes on where it left off)

Which drafts: the Drafter's (today the NgramDrafter: prompt lookup; a draft model can take its
place behind the same four calls). How many, per row and per step (what this file decides):

- a row's drafts stop at max_tokens - 1 - its output so far, so its K/V stays within its page
  table and its KV reservation;
- the verify tokens of a step (one per decode row plus the drafts) stay within half the step's
  token budget (--chunked-prefill-size): past that a forward is compute-bound and a rejected
  draft costs as much as a prompt token. And the drafts come after the step's prefill part: they
  take only what prompts left of the budget, so a burst of new requests is prefilled (its TTFT)
  before anyone speculates (measured on a 64-request echo burst: with drafts taking the budget
  first, TTFT p50 rose 1.25x and throughput fell). When the drafts found exceed the cap, the
  requests with the best recent acceptance keep theirs (each request's drafts are cut, never
  reordered);
- none in a step with --speculative-disable-by-batch-size decode rows or more;
- only as many as free pages allow: drafts never retract anyone.

A drafted row computes 1 + d tokens. Its new tokens, the accepted drafts and then the sampled one,
enter the request through the Scheduler's one way in (`_take_tokens`), which keeps the K/V of the
tokens kept only and gives the pages wholly past them back (CacheManager.trim_req), so the radix
cache only ever holds K/V of real tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from zserve.common.forward_batch import StepResult
from zserve.common.int_math import cdiv
from zserve.common.speculative_settings import SPECULATIVE_ALGORITHMS, SpeculativeSettings
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.ngram_drafter import NgramDrafter
from zserve.scheduler_proc.req import PendingReq, Req
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch


class Drafter(Protocol):
    """What SpeculativeReqs asks of a drafter (NgramDrafter today). It keeps per-request state
    from a request's first `propose` until its `release`."""

    @property
    def req_ids(self) -> set[int]: ...

    def propose(self, req: Req, max_drafts: int) -> list[int]:
        """Up to `max_drafts` tokens to follow `req`'s sequence; [] for none this step."""

    def accept_rate(self, req_id: int) -> float:
        """The request's recent acceptance (planning gives the best ones their drafts first)."""

    def on_verified(self, req_id: int, num_drafted: int, num_accepted: int) -> None: ...

    def release(self, req_id: int) -> None: ...


class SpeculativeReqs:
    def __init__(self, settings: SpeculativeSettings | None, max_prefill_tokens: int, page_size: int):
        """`settings` None (or algorithm "none"): speculation is off, every call a no-op."""
        if settings is not None and settings.algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"speculative algorithm must be one of {SPECULATIVE_ALGORITHMS}, got {settings.algorithm!r}"
            )
        self.drafter: Drafter | None = None
        if settings is not None and settings.enabled:
            self.drafter = NgramDrafter(settings.num_draft_tokens, settings.min_window, settings.max_window)
        self.page_size = page_size
        self._max_verify_tokens = max_prefill_tokens // 2  # decode rows + drafts per step
        self._token_budget = max_prefill_tokens  # a step's tokens: prefill first, then drafts from what is left
        self._off_from_rows = settings.disable_by_batch_size if settings is not None else 0  # 0: never
        self.num_drafts = 0  # totals (SchedulerStats): decode rows that carried drafts
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def plan(self, reqs: list[Req], prefill_extend_lens: list[int], cache: CacheManager, num_keep_pages: int) -> None:
        """Give this step's decode rows `reqs` their drafts (`Req.drafts`) and the pages for them,
        after the prefill part (`prefill_extend_lens`) took its share of the token budget."""
        drafter = self.drafter
        if drafter is None or not reqs or 0 < self._off_from_rows <= len(reqs):
            return
        cap = min(self._max_verify_tokens, self._token_budget - sum(prefill_extend_lens)) - len(reqs)
        if cap <= 0:
            return
        planned: list[tuple[Req, list[int]]] = []
        num_found = 0
        for req in reqs:
            drafts = drafter.propose(req, req.max_tokens - 1 - len(req.output_ids))
            if drafts:
                planned.append((req, drafts))
                num_found += len(drafts)
        if num_found > cap:
            planned.sort(key=lambda p: -drafter.accept_rate(p[0].req_id))
        drafted = []
        for req, drafts in planned:
            if cap <= 0:
                break
            req.drafts = drafts[:cap]
            cap -= len(req.drafts)
            drafted.append(req)
        self._alloc_draft_pages(cache, drafted, num_keep_pages)

    def _alloc_draft_pages(self, cache: CacheManager, reqs: list[Req], num_keep_pages: int) -> None:
        """Pages for the drafts of `reqs`, after this step's token has its page: a request whose
        drafts need pages that are not free or evictable beside `num_keep_pages` keeps only the
        drafts its pages hold."""
        ps = self.page_size
        for req in reqs:
            num_new_pages = cdiv(req.cached_len + 1 + len(req.drafts), ps) - req.num_pages
            if num_new_pages <= 0:
                continue
            assert req.num_pages + num_new_pages <= req.max_num_pages, f"req {req.req_id}: drafts past its page table"
            page_ids = cache.try_alloc(num_new_pages, num_keep_pages)
            if page_ids is None:
                req.drafts = req.drafts[: req.num_pages * ps - req.cached_len - 1]
                continue
            req.page_table[req.num_pages : req.num_pages + num_new_pages] = page_ids
            req.num_pages += num_new_pages

    @staticmethod
    def num_accepted(batch: ScheduledBatch, result: StepResult) -> list[int] | None:
        """Per decode row, the drafts the worker accepted; None when the step carried none."""
        if not batch.num_draft_tokens:
            return None
        assert result.num_accepted is not None, f"step {batch.step_id}: drafts sent, no num_accepted back"
        return result.num_accepted.tolist()

    def verified(self, req: Req, num_accepted: int) -> list[int]:
        """A drafted row is back: its drafts go, and the first `num_accepted` are returned (none
        for a request aborted in flight), counted, and shown to the drafter's back-off."""
        drafts, req.drafts = req.drafts, ()
        if req.is_aborted:
            return []
        assert 0 <= num_accepted <= len(drafts), f"req {req.req_id}: {num_accepted} of {len(drafts)} drafts accepted"
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        self.drafter.on_verified(req.req_id, len(drafts), num_accepted)
        return list(drafts[:num_accepted])

    def totals(self) -> dict[str, int]:
        """The speculative totals of SchedulerStats (all 0 when off)."""
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
        }

    def release(self, req_id: int) -> None:
        """`req_id` ended: its drafting state goes (a no-op when off or never drafted)."""
        if self.drafter is not None:
            self.drafter.release(req_id)

    def check_integrity(self, live: Mapping[int, PendingReq | Req]) -> None:
        """The drafter keeps state for live requests only; no request holds drafts outside a step."""
        if self.drafter is not None:
            assert self.drafter.req_ids <= set(live), "the drafter keeps state for a request that ended"
        for entry in live.values():
            assert not isinstance(entry, Req) or entry.in_flight or not entry.drafts, (
                f"request {entry.req_id} keeps drafts outside a step"
            )
