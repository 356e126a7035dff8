"""DecodeManager: the running requests (prefill done, generating), and their pages for each step.

Retraction (preemption by recompute; only under the `estimated` KV reservation): when a decode
step cannot get a page for every running request while keeping the pages the ChunkedReq's prompt
still needs, running requests are retracted, the most recently admitted first and never the
oldest running one (so every request finishes); should the oldest alone still not get its page,
the ChunkedReq gives way. A retracted request caches what it computed, frees its pages and row,
and goes back to the head of the queue with prompt + output as its prompt (the Scheduler's
`_retract`); re-admitted, it computes that (a prefix hit where the cache kept it) and samples its
next token from the last position, so its client sees one uninterrupted stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.req import Req


class DecodeManager:
    """Tracks running requests in the order they started running. What stays reserved for them
    is the KvReservation's to say; here: who needs a page this step, and whom to retract."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self._running: dict[int, Req] = {}

    def __len__(self) -> int:
        return len(self._running)

    def holds(self, req: Req) -> bool:
        return self._running.get(req.req_id) is req

    @property
    def reqs(self) -> Iterable[Req]:
        return self._running.values()

    def add(self, req: Req) -> None:
        assert req.req_id not in self._running and not req.is_prefilling, req.req_id
        self._running[req.req_id] = req

    def remove(self, req: Req) -> None:
        """Drop a finished, aborted or retracted request."""
        del self._running[req.req_id]

    def retraction_victim(self) -> Req | None:
        """The request to retract first: the most recently admitted (first admission), never the
        oldest running one, so the oldest always makes progress. None when one or none runs."""
        if len(self._running) < 2:
            return None
        oldest = min(self._running.values(), key=lambda r: r.admit_seq)
        return max((r for r in self._running.values() if r is not oldest), key=lambda r: r.admit_seq)

    def schedule_decode(
        self, cache: CacheManager, num_keep_pages: Callable[[], int], retract: Callable[[Req | None], None],
    ) -> tuple[list[Req], int]:
        """Every running request with a page for this step's token, and how many were retracted
        for it: until the pages fit beside `num_keep_pages()` (the ChunkedReq's prompt), the
        retraction victim goes through `retract` (None: no victim, the ChunkedReq gives way)."""
        num_retracted = 0
        while (reqs := self.alloc_step_pages(list(self._running.values()), cache, num_keep_pages())) is None:
            retract(self.retraction_victim())
            num_retracted += 1
        return reqs, num_retracted

    def alloc_step_pages(self, reqs: list[Req], cache: CacheManager, num_keep_pages: int) -> list[Req] | None:
        """`reqs` (running ones), each with a page for the token it writes this step: a request
        whose pages are full gets its next page (one alloc for all). None, with nothing taken,
        when that would leave fewer than `num_keep_pages` pages free or evictable."""
        ps = self.page_size
        needy = [r for r in reqs if r.cached_len == r.num_pages * ps]
        if needy:
            page_ids = cache.try_alloc(len(needy), num_keep_pages)
            if page_ids is None:
                return None
            pages = page_ids.tolist()
            for req, page in zip(needy, pages, strict=True):
                req.page_table[req.num_pages] = page
                req.num_pages += 1
        return reqs

    def check_integrity(self) -> None:
        for req in self._running.values():
            assert not req.is_prefilling, f"running request {req.req_id} has prompt left"
            assert req.num_pages <= req.max_num_pages, f"running request {req.req_id} holds more pages than it can use"
