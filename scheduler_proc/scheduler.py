"""Scheduler: the scheduler core, from plain values, with no sockets, model or torch.

    submit / abort          -> requests enter the queue, or leave from any state
    next_batch()            -> the ForwardBatch of one step (None when there is nothing to run)
    on_result(StepResult)   -> append sampled tokens, finish, cache and free

Each returns the TokenOut records (common/messages.py) to send to the detokenizer. One batch is in flight at a time. A request aborted while its batch is in flight is answered at
once but freed by on_result, after the worker is done with its pages, and gets nothing after
its abort update.

Retraction (preemption by recompute; only under the `estimated` KV reservation): when a decode
step cannot get a page for every running request while keeping the pages the ChunkedReq's prompt
still needs, running requests are retracted, the most recently admitted first and never the
oldest running one (so every request finishes); should the oldest alone still not get its page,
the ChunkedReq gives way. A retracted request caches what it computed, frees its pages and row,
and goes back to the head of the queue with prompt + output as its prompt; re-admitted, it
computes that (a prefix hit where the cache kept it) and samples its next token from the last
position, so its client sees one uninterrupted stream.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch, StepResult
from zserve.common.histogram import QUEUE_BOUNDS_S, Histogram
from zserve.common.messages import NO_TOKEN_IDS, PromptLogprobs, TokenOut
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.admission_policy import AdmissionPolicy
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.decode_manager import DecodeManager
from zserve.scheduler_proc.invariants import check_pages, check_queue, check_reqs
from zserve.scheduler_proc.kv_reservation import KvReservation
from zserve.scheduler_proc.prefill_adder import PrefillAdder
from zserve.scheduler_proc.req import ChunkedReq, PendingReq, Req
from zserve.scheduler_proc.req_intake import ReqIntake
from zserve.scheduler_proc.req_table import ReqTable
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch
from zserve.scheduler_proc.scheduler_stats import SchedulerStats
from zserve.scheduler_proc.step_outputs import StepOutputs, gather_prompt_scores, take_prompt_logprobs

__all__ = ["STEP_POLICIES", "Scheduler", "SchedulerStats"]

logger = logging.getLogger(__name__)

STEP_POLICIES = ("prefill-first", "decode-first", "mixed")


class Scheduler:
    def __init__(
        self,
        *,
        num_pages: int,
        page_size: int,
        max_running_requests: int,
        max_prefill_tokens: int,
        context_len: int,
        eos_token_ids: Sequence[int],
        schedule_policy: str,
        admission_policy: str,
        admission_lookahead: int,
        force_fifo_every: int,
        enable_radix_cache: bool,
        max_queued_requests: int,
        kv_reservation: str,
        schedule_conservativeness: float,
        prefill_max_requests: int,
        seed: int,
        on_pages_freed: Callable[[np.ndarray], None] | None = None,
    ):
        """The sizes come from the model worker (`WorkerReady`); the policy knobs from the server
        config through `scheduler_knobs` (the one source of their defaults). `on_pages_freed` is
        a test hook (see CacheManager)."""
        if schedule_policy not in STEP_POLICIES:
            raise ValueError(f"schedule policy must be one of {STEP_POLICIES}, got {schedule_policy!r}")
        sizes = {"num_pages": num_pages, "page_size": page_size, "max_running_requests": max_running_requests,
                 "max_prefill_tokens": max_prefill_tokens, "context_len": context_len, "max_queued_requests": max_queued_requests}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if prefill_max_requests < 0:
            raise ValueError(f"prefill_max_requests must be >= 0 (0 = no cap), got {prefill_max_requests}")
        self.page_size = page_size
        self.context_len = context_len
        self.max_prefill_tokens = max_prefill_tokens
        self.max_queued_requests = max_queued_requests
        self.schedule_policy = schedule_policy
        self.prefill_max_requests = prefill_max_requests or None
        self._reservation = KvReservation(kv_reservation, page_size, schedule_conservativeness)
        self._intake = ReqIntake(
            context_len=context_len, page_size=page_size, num_pages=num_pages, eos_token_ids=eos_token_ids, seed=seed
        )
        self.eos_token_ids = self._intake.eos_token_ids
        self._cache = CacheManager(num_pages, page_size, enable_radix_cache, on_pages_freed)
        self._req_table = ReqTable(max_running_requests)
        self._decode = DecodeManager(page_size)
        self._admission = AdmissionPolicy(admission_policy, admission_lookahead, force_fifo_every)
        self._queue: deque[PendingReq] = deque()
        self._chunked: ChunkedReq | None = None  # the front of the pending list, before the queue
        self._live: dict[int, PendingReq | Req] = {}  # every request that has not had its final update
        self._in_flight: ScheduledBatch | None = None
        self._last_step_was_prefill = False
        self._num_admitted = 0  # first admissions so far: the next one's admit_seq
        self._totals = SchedulerStats()
        self._queued_since_s: dict[int, float] = {}  # waiting for a first admission: since when (monotonic)
        self._queue_time_s = Histogram.of(QUEUE_BOUNDS_S)  # submit -> first admission

    # -- requests in and out -----------------------------------------------------------------

    def submit(self, req_id: int, input_ids: Sequence[int] | np.ndarray, params: SamplingParams) -> list[TokenOut]:
        """Queue a request ([]), or refuse it at once with an ERROR update saying why."""
        input_ids = np.array(input_ids, dtype=np.int32).reshape(-1)
        max_tokens = self._intake.max_tokens(len(input_ids), params)
        self._totals.num_submitted += 1
        refusal = self._refusal(req_id, len(input_ids), max_tokens)
        if refusal is not None:
            code, error = refusal
            logger.info("req %d refused (%s): %s", req_id, code.text, error)
            self._totals.num_refused += 1
            return [TokenOut(req_id=req_id, token_ids=NO_TOKEN_IDS, finish_reason=FinishReason.ERROR, code=code, error=error)]
        pending = self._intake.pending(req_id, input_ids, params, max_tokens)
        self._queue.append(pending)
        self._live[req_id] = pending
        self._queued_since_s[req_id] = time.monotonic()
        return []

    def abort(self, req_id: int, finish_reason: FinishReason = FinishReason.ABORT) -> list[TokenOut]:
        """End a request in any state with `finish_reason` (ABORT, or STOP for a stop string the
        detokenizer found). Unknown or already finished ids get []."""
        entry = self._live.pop(req_id, None)
        self._queued_since_s.pop(req_id, None)
        if entry is None:
            return []
        if isinstance(entry, PendingReq):
            self._queue.remove(entry)
            state = "waiting"
        elif entry.in_flight:
            entry.is_aborted = True  # on_result frees its pages once the worker is done with them
            self._detach(entry)
            state = "in flight"
        else:
            state = "between chunks" if entry.is_prefilling else "running"
            self._release(entry)
        if finish_reason is FinishReason.STOP:  # the detokenizer matched a stop string: a normal finish
            logger.info("req %d finished (stop string) while %s", req_id, state)
            self._totals.num_finished += 1
        else:
            logger.info("req %d aborted (%s) while %s", req_id, finish_reason.text, state)
            self._totals.num_aborted += 1
        return [self._final_update(entry, finish_reason)]

    # -- one step ----------------------------------------------------------------------------

    def next_batch(self) -> ForwardBatch | None:
        assert self._in_flight is None, "next_batch() called before on_result() of the batch in flight"
        decode_reqs: list[Req] = []
        adder: PrefillAdder | None = None
        if not len(self._decode):
            self._reservation.on_idle()
        if self.schedule_policy == "mixed":
            decode_reqs = self._schedule_decode()
            adder = self._schedule_prefill(self.max_prefill_tokens - len(decode_reqs))
        elif self.schedule_policy == "decode-first" and len(self._decode) and self._last_step_was_prefill:
            decode_reqs = self._schedule_decode()
        else:
            adder = self._schedule_prefill(self.max_prefill_tokens)
            if adder is None:
                decode_reqs = self._schedule_decode()
        if adder is None and not decode_reqs:
            assert not self._queue and self._chunked is None, "scheduler stalled: requests wait while nothing runs"
            return None
        batch = ScheduledBatch(
            self._totals.num_steps,
            decode_reqs,
            adder.reqs if adder else [],
            adder.extend_lens if adder else [],
            adder.copy_of if adder else [],
        )
        for req in batch.reqs:
            req.in_flight = True  # an abort now only marks it: the worker is using its pages
        self._in_flight = batch
        self._last_step_was_prefill = adder is not None
        self._totals.num_steps += 1
        self._totals.num_running_peak = max(self._totals.num_running_peak, len(self._decode))
        return batch.to_forward_batch(self._req_table)

    def on_result(self, result: StepResult) -> list[TokenOut]:
        batch = self._in_flight
        assert batch is not None and result.step_id == batch.step_id, f"result for step {result.step_id}, in flight: {batch and batch.step_id}"
        self._in_flight = None
        outputs = StepOutputs.of(result)
        assert len(outputs) == batch.num_sampled, f"step {batch.step_id}: {len(outputs)} tokens for {batch.num_sampled} sampled requests"
        num_decode = len(batch.decode_reqs)
        self._totals.num_decoded_tokens += num_decode
        self._totals.num_prefilled_tokens += batch.num_prefilled_tokens
        if result.prompt_logprobs is not None:
            gather_prompt_scores(batch, result)
        self._on_decoded(batch.decode_reqs, outputs)
        self._on_prefilled(batch, outputs, first_sampled=num_decode)
        self._totals.num_generated_tokens += len(outputs.updates)
        return outputs.updates

    def _on_decoded(self, reqs: list[Req], outputs: StepOutputs) -> None:
        """The hot path: one new token for each running request (sampled rows 0 .. len(reqs) - 1)."""
        for i, req in enumerate(reqs):
            req.in_flight = False
            req.cached_len += 1
            if req.is_aborted:  # its abort update is sent: drop the token, free it now
                self._release(req)
                continue
            self._take_token(req, outputs, i)

    def _on_prefilled(self, batch: ScheduledBatch, outputs: StepOutputs, first_sampled: int) -> None:
        """Prefill chunks: a finished prompt gives the first token (the request's first update).
        The sampled ones take the sampled rows from `first_sampled` on, in order."""
        sampled_idxs = iter(range(first_sampled, len(outputs)))
        for req, extend_len, sampled in zip(batch.prefill_reqs, batch.prefill_extend_lens, batch.prefill_is_sampled, strict=True):
            req.in_flight = False
            req.cached_len += extend_len
            i = next(sampled_idxs) if sampled else None
            if req.is_aborted:
                self._release(req)
            elif i is None:  # prompt left: share what is computed so far, say nothing yet
                self._cache.cache_req(req)
            elif self._take_token(req, outputs, i, prompt=take_prompt_logprobs(req)) is None:
                self._cache.cache_req(req)
                self._decode.add(req)

    def _take_token(self, req: Req, outputs: StepOutputs, sampled_idx: int, prompt: PromptLogprobs | None = None) -> FinishReason | None:
        """Append the token sampled for `req` to its output and its update to `outputs`; finish
        it if that token ends it. Returns why it finished, None when it goes on."""
        token_id = outputs.token_id_list[sampled_idx]
        req.output_ids.append(token_id)
        finish_reason = _finish_reason(req, token_id)
        outputs.add(req, sampled_idx, finish_reason, prompt=prompt)
        if finish_reason is not None:
            self._finish(req, finish_reason)
        return finish_reason

    # -- state -------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._queue) or self._chunked is not None or len(self._decode) > 0 or self._in_flight is not None

    def stats(self) -> SchedulerStats:
        cache = self._cache
        return replace(
            self._totals,
            num_waiting=len(self._queue),
            num_prefilling=int(self._chunked is not None),
            num_running=len(self._decode),
            num_free_pages=cache.num_free_pages,
            num_cached_pages=cache.num_cached_pages,
            num_evictable_pages=cache.num_evictable_pages,
            num_used_pages=cache.num_pages - cache.num_free_pages - cache.num_cached_pages,
            num_reserved_pages=self._num_reserved_pages(),
            new_token_ratio=self._reservation.new_token_ratio,
        )

    def in_flight_sampled_req_ids(self) -> list[int]:
        """The req_ids of the batch in flight that get a token, in the batch's sampled order."""
        return self._in_flight.sampled_req_ids() if self._in_flight is not None else []

    def record_step_time(self, wait_s: float, schedule_s: float) -> None:
        """The process loop's timing of one step: waiting for the worker, and the scheduler's own
        time before it (0 after an idle gap). Totals in stats()."""
        self._totals.step_wait_s += wait_s
        self._totals.schedule_s += schedule_s

    def histograms(self) -> dict[str, Histogram]:
        return {"queue_time_seconds": self._queue_time_s}

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant: every page is free, cached,
        or owned by one live request; every row is free or owned; reservations add up (see invariants.py)."""
        holders = {id(r): r for r in self._live.values() if isinstance(r, Req)}
        if self._in_flight is not None:  # requests aborted in flight hold pages until on_result
            holders.update((id(r), r) for r in self._in_flight.reqs)
        reqs = list(holders.values())
        self._cache.check_integrity(reqs)
        self._req_table.check_integrity({r.row_idx: r.req_id for r in reqs})
        self._decode.check_integrity()
        check_queue(self._queue, self._live, self._queued_since_s, self.max_queued_requests)
        check_reqs(reqs, self._decode, self._chunked, self._live, page_size=self.page_size, batch_in_flight=self._in_flight is not None)
        num_reserved_pages = self._num_reserved_pages() if self._reservation.is_full else None
        check_pages(self._cache.num_available_pages, self._chunked_prompt_pages(), num_reserved_pages, self._totals.num_retracted)

    # -- internals ---------------------------------------------------------------------------

    def _refusal(self, req_id: int, num_prompt_tokens: int, max_tokens: int) -> tuple[ErrorCode, str] | None:
        """Why the request is refused now, and whose fault that is; None to queue it."""
        if req_id in self._live:
            return ErrorCode.INTERNAL, f"duplicate req_id {req_id}: a request with this id is still live"
        error = self._intake.refusal(num_prompt_tokens, max_tokens)
        if error is not None:
            return ErrorCode.INVALID, error
        if len(self._queue) >= self.max_queued_requests:
            return ErrorCode.BUSY, f"server busy: {len(self._queue)} requests waiting (max_queued_requests={self.max_queued_requests})"
        return None

    def _schedule_prefill(self, token_budget: int) -> PrefillAdder | None:
        """The prefill part of this step, or None when nothing can be prefilled."""
        if token_budget <= 0 or (self._chunked is None and not self._queue):
            return None
        # Without a free row nobody is admitted this step, so the reservation sum (a pass over every
        # running request) is not needed: the ChunkedReq's continuation checks nothing.
        num_reserved_pages = self._num_reserved_pages() if self._req_table.num_free_rows else 0
        adder = PrefillAdder(
            token_budget=token_budget,
            reserved_size=num_reserved_pages * self.page_size,
            reservation=self._reservation,
            cache=self._cache,
            req_table=self._req_table,
            max_new_reqs=self.prefill_max_requests,
            next_admit_seq=self._num_admitted,
        )
        if self._chunked is not None:
            adder.add_chunked(self._chunked)
        self._admission.admit(adder, self._queue)
        self._chunked = adder.chunked
        self._num_admitted = adder.next_admit_seq
        now_s = time.monotonic()
        for req in adder.admitted:
            self._live[req.req_id] = req
            queued_since_s = self._queued_since_s.pop(req.req_id, None)  # None for a retracted one's re-admission
            if queued_since_s is not None:
                self._queue_time_s.observe(now_s - queued_since_s)
            self._totals.num_prompt_tokens += req.num_prompt_tokens
            self._totals.num_prefix_hit_tokens += req.cached_len  # this admission's hit (cached_len moves on in on_result)
        return adder if adder.reqs else None

    def _schedule_decode(self) -> list[Req]:
        """Every running request with a page for this step's token, after retracting requests
        until there are pages for all of them beside the ChunkedReq's prompt (see the module doc)."""
        if not len(self._decode):
            return []
        num_retracted = 0
        while (reqs := self._decode.schedule_decode(self._cache, self._chunked_prompt_pages())) is None:
            victim = self._decode.retraction_victim()
            if victim is None:  # only the oldest runs and it still gets no page: the ChunkedReq gives way
                assert self._chunked is not None, "the oldest running request alone finds no page"
                victim = self._chunked.req
            self._retract(victim)
            num_retracted += 1
        if num_retracted:
            self._reservation.on_retracted()
        else:
            self._reservation.on_decode_step()
        return reqs

    def _retract(self, req: Req) -> None:
        """Put `req` back at the head of the queue; what it computed stays in the radix cache."""
        num_kept_tokens = req.cached_len // self.page_size * self.page_size if self._cache.enable_radix_cache else 0
        pending = req.retracted()
        self._release(req)
        self._queue.appendleft(pending)
        self._live[req.req_id] = pending
        self._totals.num_retracted += 1
        logger.info(
            "req %d retracted: %d of its %d tokens kept in the cache, %d running",
            req.req_id, num_kept_tokens, req.seq_len, len(self._decode),
        )

    def _chunked_prompt_pages(self) -> int:
        """Pages the ChunkedReq's prompt still needs: kept for it, whatever the estimates say."""
        if self._chunked is None:
            return 0
        req = self._chunked.req
        return -(-req.num_prompt_tokens // self.page_size) - req.num_pages

    def _num_reserved_pages(self) -> int:
        """Pages the KvReservation keeps promised to admitted requests and not yet allocated (the
        running ones and the ChunkedReq; outside a step nobody else holds a reservation)."""
        reqs = list(self._decode.reqs)
        if self._chunked is not None:
            reqs.append(self._chunked.req)
        return self._reservation.num_reserved_pages(reqs)

    def _finish(self, req: Req, finish_reason: FinishReason) -> None:
        logger.debug("req %d finished (%s): %d output tokens", req.req_id, finish_reason.text, len(req.output_ids))  # the frontend logs it at INFO, with latencies
        del self._live[req.req_id]
        self._totals.num_finished += 1
        self._release(req)

    def _detach(self, req: Req) -> None:
        """Take `req` out of the running set or the ChunkedReq place; it keeps its pages."""
        if self._decode.holds(req):
            self._decode.remove(req)
        if self._chunked is not None and self._chunked.req is req:
            self._chunked = None

    def _release(self, req: Req) -> None:
        """Detach `req`, cache what it computed, free the rest and its row."""
        self._detach(req)
        self._cache.release_req(req)
        self._req_table.free(req.row_idx, req.req_id)

    def _final_update(self, entry: PendingReq | Req, finish_reason: FinishReason) -> TokenOut:
        num_cached = entry.num_cached_tokens or 0  # a PendingReq has one only after a retraction
        return TokenOut(req_id=entry.req_id, token_ids=NO_TOKEN_IDS, finish_reason=finish_reason, num_cached_tokens=num_cached)


def _finish_reason(req: Req, token_id: int) -> FinishReason | None:
    """Why `req` ends with `token_id` just appended, or None. The context limit is already in
    max_tokens (what the context leaves, when the request gave none)."""
    if token_id in req.stop_ids:
        return FinishReason.STOP
    if len(req.output_ids) >= req.max_tokens:
        return FinishReason.LENGTH
    return None

