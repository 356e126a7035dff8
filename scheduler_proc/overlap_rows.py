"""OverlapRows: who runs in the next step while a step is still with the worker (overlap scheduling).

With --enable-overlap-schedule the scheduler builds and sends step N+1 while the worker runs step
N, so the worker never waits for the scheduler's turn; a step decides nothing that step N's result
decides:

    in step N as a decoding row          joins N+1 fed future_token(its row) (common/forward_batch.py),
                                         unless N's token is its last by length (it ends there), or
                                         it is under a grammar or asks for penalties (its mask or
                                         counts need N's token), or speculative decoding is on (its
                                         drafts do): then it waits for N's result
    running and not in step N            joins as always (its last token is known)
    its prompt's last chunk in step N    waits (it starts running with N's result)
    the ChunkedReq in step N             the whole step waits (its next chunk starts where N's ends,
                                         and goes before anyone newer)
    a decode step short of pages         the whole step waits (a retraction folds N's token into the
                                         request's prompt)

A request fed a future token holds it as the last of its output (negative, never a real id) and
counts that token's K/V as computed, so its pages and positions are step N+1's; step N's result
puts the real token in its place (`take`) before the finish checks, as for any token. One that ends
there is still in step N+1: it is answered at once, freed with N+1's result, and N+1's token for
it is dropped (the Scheduler's `_finish`, Req.is_aborted).
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from zserve.common.forward_batch import future_token
from zserve.scheduler_proc.req import Req
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch


class WaitForResult(Exception):
    """The next step cannot be built before the result of the step in flight."""


class OverlapRows:
    def __init__(self, enabled: bool, speculative: bool, constrained: Container[int]):
        """`constrained`: the req_ids under a grammar (ConstrainedReqs)."""
        self.is_on = enabled
        self._speculative = speculative
        self._constrained = constrained

    def follows(self, req: Req, row: int | None) -> bool:
        """Whether `req`, decoding at `row` of the step in flight (None: not a decoding row there),
        can be fed that row's token in the next step."""
        return (
            row is not None and not self._speculative and not req.params.has_penalties
            and req.req_id not in self._constrained and len(req.output_ids) + 1 < req.max_tokens
        )

    def ahead(self, running: Iterable[Req], in_flight: ScheduledBatch) -> list[Req]:
        """Of the `running` requests, those that run in the step built while `in_flight` runs: any not in it,
        and those of its decoding rows that follow, fed their future token."""
        rows = {r.req_id: i for i, r in enumerate(in_flight.decode_reqs)}
        reqs = []
        for req in running:
            if req.in_flight:
                row = rows.get(req.req_id)
                if not self.follows(req, row):
                    continue
                self.feed(req, row)
            reqs.append(req)
        return reqs

    @staticmethod
    def feed(req: Req, row: int) -> None:
        """`req` runs in the next step on the token the step in flight samples at `row`."""
        req.output_ids.append(future_token(row))
        req.cached_len += 1  # that step writes its last known token's K/V

    @staticmethod
    def unfeed(reqs: Iterable[Req]) -> None:
        """Undo `feed` for those of `reqs` fed (the step was not sent after all)."""
        for req in reqs:
            if OverlapRows.is_fed(req):
                req.output_ids.pop()
                req.cached_len -= 1

    @staticmethod
    def is_fed(req: Req) -> bool:
        """Whether `req` holds a future token: the next step in flight runs on the token still to come."""
        return bool(req.output_ids) and req.output_ids[-1] < 0

    @staticmethod
    def take(req: Req, token_id: int) -> None:
        """The token `req`'s future token stood for is back: it takes its place."""
        assert OverlapRows.is_fed(req), f"req {req.req_id} holds no future token"
        req.output_ids[-1] = token_id
