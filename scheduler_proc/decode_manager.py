"""DecodeManager: the running requests (prefill done, generating) and their KV reservation."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_proc.cache_manager import CacheManager
from scheduler_proc.req import Req


class DecodeManager:
    """Tracks running requests in admission order and `num_reserved_pages`: the pages they may
    still need (`max_num_pages - num_pages` each). Admission keeps that many pages free or
    evictable, so a decode step never waits for memory and no running request is preempted."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self._running: dict[int, Req] = {}
        self.num_reserved_pages = 0

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
        self.num_reserved_pages += req.num_reserved_pages

    def remove(self, req: Req) -> None:
        """Drop a finished or aborted request; its unused reservation is released with it."""
        del self._running[req.req_id]
        self.num_reserved_pages -= req.num_reserved_pages

    def schedule_decode(self, cache: CacheManager) -> list[Req]:
        """Every running request, each with a page for the token it writes this step. A request
        whose pages are full gets its next page from its reservation (one alloc for all)."""
        reqs = list(self._running.values())
        ps = self.page_size
        needy = [r for r in reqs if r.cached_len == r.num_pages * ps]
        if needy:
            pages = cache.alloc(len(needy)).tolist()
            for req, page in zip(needy, pages, strict=True):
                req.page_table[req.num_pages] = page
                req.num_pages += 1
            self.num_reserved_pages -= len(needy)
        return reqs

    def check_integrity(self) -> None:
        total = sum(r.num_reserved_pages for r in self._running.values())
        assert total == self.num_reserved_pages, f"decode manager counts {self.num_reserved_pages} reserved pages, requests hold {total}"
        for req in self._running.values():
            assert not req.is_prefilling, f"running request {req.req_id} has prompt left"
