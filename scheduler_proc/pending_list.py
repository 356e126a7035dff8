"""PendingList: the requests waiting for (more) prefill, and the prefill part of each step.

    submit --> building   [ under a grammar still being built, in arrival order ]
                   | built: to the tail of `ready` (poll)      failed: out (the Scheduler ends it)
               chunked      the ChunkedReq: admitted, prompt left; its next chunk goes first
               ready      [ retracted (head) | new, in arrival order ]  --> AdmissionPolicy --> PrefillAdder

A request under a grammar is not offered for admission until its grammar is built (vLLM's
WAITING_FOR_FSM), so a slow compile holds back that request alone. A retracted request goes back
to the head of `ready` (its grammar, if any, stays built). Every waiting request counts towards
`max_queued_requests`; retracted ones come on top of it (they were admitted once).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping

from zserve.common.error_code import ErrorCode
from zserve.common.histogram import QUEUE_BOUNDS_S, Histogram
from zserve.common.int_math import cdiv
from zserve.scheduler_proc.admission_policy import AdmissionPolicy
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.constrained_reqs import ConstrainedReqs
from zserve.scheduler_proc.kv_reservation import KvReservation
from zserve.scheduler_proc.prefill_adder import PrefillAdder
from zserve.scheduler_proc.req import ChunkedReq, PendingReq, Req
from zserve.scheduler_proc.req_table import ReqTable


class PendingList:
    def __init__(
        self, *, max_queued_requests: int, prefill_max_requests: int | None, admission: AdmissionPolicy,
        constrained: ConstrainedReqs, reservation: KvReservation, cache: CacheManager, req_table: ReqTable,
    ):
        self.max_queued_requests = max_queued_requests
        self.prefill_max_requests = prefill_max_requests  # None: no cap
        self.admission = admission
        self.constrained = constrained
        self.reservation = reservation
        self.cache = cache
        self.req_table = req_table
        self.chunked: ChunkedReq | None = None
        self.ready: deque[PendingReq] = deque()  # offered for admission, in this order
        self.building: list[PendingReq] = []  # waiting for their grammar
        self.queue_time_s = Histogram.of(QUEUE_BOUNDS_S)  # submit -> first admission
        self._queued_since_s: dict[int, float] = {}  # never admitted: since when (monotonic)
        self._num_admitted = 0  # first admissions so far: the next one's admit_seq

    def __len__(self) -> int:
        """Requests waiting for admission (the ChunkedReq is admitted)."""
        return len(self.ready) + len(self.building)

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_queued_requests

    @property
    def num_chunk_pages(self) -> int:
        """Pages the ChunkedReq's prompt still needs: kept for it, whatever the estimates say."""
        if self.chunked is None:
            return 0
        req = self.chunked.req
        return cdiv(req.num_prompt_tokens, self.cache.page_size) - req.num_pages

    def add(self, pending: PendingReq) -> None:
        """A new request, at the tail (of `building` when its grammar is still to be built)."""
        (self.building if pending.req_id in self.constrained else self.ready).append(pending)
        self._queued_since_s[pending.req_id] = time.monotonic()

    def add_retracted(self, pending: PendingReq) -> None:
        self.ready.appendleft(pending)

    def remove(self, pending: PendingReq) -> None:
        """An aborted request leaves, from wherever it waits."""
        (self.building if pending in self.building else self.ready).remove(pending)
        self._queued_since_s.pop(pending.req_id, None)

    def detach(self, req: Req) -> None:
        """`req` leaves the ChunkedReq place (retracted or aborted), if it holds it."""
        if self.chunked is not None and self.chunked.req is req:
            self.chunked = None

    def poll(self) -> list[tuple[PendingReq, ErrorCode, str]]:
        """Move the requests whose grammar is built to the tail of `ready`, in arrival order; take
        out those whose grammar failed, and return them with why."""
        if not self.building:
            return []
        failed, still_building = [], []
        for pending in self.building:
            if self.constrained.is_ready(pending.req_id):
                self.ready.append(pending)
            elif (failure := self.constrained.failure(pending.req_id)) is not None:
                self._queued_since_s.pop(pending.req_id)
                failed.append((pending, *failure))
            else:
                still_building.append(pending)
        self.building = still_building
        return failed

    def schedule_prefill(self, token_budget: int, num_reserved_pages: Callable[[], int]) -> PrefillAdder | None:
        """The prefill part of this step: the ChunkedReq's next chunk, then what the admission
        policy admits within the budget; None when nothing can be prefilled. `num_reserved_pages`:
        what the KvReservation keeps for the admitted requests (asked only when a row is free:
        without one nobody is admitted, and the ChunkedReq's continuation checks nothing)."""
        if token_budget <= 0 or (self.chunked is None and not self.ready):
            return None
        adder = PrefillAdder(
            token_budget=token_budget,
            reserved_size=(num_reserved_pages() if self.req_table.num_free_rows else 0) * self.cache.page_size,
            reservation=self.reservation,
            cache=self.cache,
            req_table=self.req_table,
            max_new_reqs=self.prefill_max_requests,
            next_admit_seq=self._num_admitted,
        )
        if self.chunked is not None:
            adder.add_chunked(self.chunked)
        self.admission.admit(adder, self.ready)
        self.chunked = adder.chunked
        self._num_admitted = adder.next_admit_seq
        now_s = time.monotonic()
        for req in adder.admitted:
            queued_since_s = self._queued_since_s.pop(req.req_id, None)  # None for a retracted one's re-admission
            if queued_since_s is not None:
                self.queue_time_s.observe(now_s - queued_since_s)
        return adder if adder.reqs else None

    def check_integrity(self, live: Mapping[int, PendingReq | Req]) -> None:
        """Every waiting request waits once, where its grammar says, and is live; the clocks run
        for those never admitted."""
        waiting = [*self.ready, *self.building]
        waiting_ids = {p.req_id for p in waiting}
        num_new = sum(not p.is_retracted for p in waiting)
        assert len(waiting_ids) == len(waiting) and num_new <= self.max_queued_requests, (
            "the queue holds a request twice, or too many"
        )
        assert all(p.req_id in self.constrained and not p.is_retracted for p in self.building), (
            "a request waits for no grammar"
        )
        pending_live = {i for i, e in live.items() if isinstance(e, PendingReq)}
        assert pending_live == waiting_ids, (
            f"live waiting requests {sorted(pending_live ^ waiting_ids)} are not queued, or the reverse"
        )
        assert all(live[p.req_id] is p for p in waiting), "a queued request is not the live one"
        never_admitted = {p.req_id for p in waiting if not p.is_retracted}
        assert set(self._queued_since_s) == never_admitted, "queue-time clocks do not match the requests never admitted"
