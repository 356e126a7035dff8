"""Scheduler: the scheduler core, from plain values, with no sockets, model or torch.

    submit / abort          -> requests (n copies of one prompt) enter the queue, or leave from any state
    poll_grammars()         -> requests whose grammar is built join the queue; a failed one ends
    next_batch()            -> the ForwardBatch of one step (None when there is nothing to run)
    on_result(StepResult)   -> append sampled tokens, finish, cache and free

Each but next_batch returns the TokenOut records (common/messages.py) to send to the detokenizer.
One batch is in flight at a time, or two under overlap scheduling (--enable-overlap-schedule:
next_batch() builds step N+1 while step N is with the worker, OverlapRows says who may run in it;
None while it must wait for N's result). A request aborted (or finished, under overlap) while a
batch holding it is in flight is answered at once but freed by the on_result of its last batch
in flight, after the worker is done with its pages, and gets nothing after its final update. A
request under a grammar (structured output) waits in the queue until its grammar is built, and is
sampled under its mask (ConstrainedReqs, GrammarSource). Under speculative decoding a decode row
may carry draft tokens (SpeculativeReqs). Every sampled token enters its request in one place,
`_take_tokens`, through the finish checks.

What stands alone lives beside it: a request's way in, n copies and seeds (ReqIntake), who waits
and each step's prefill part (PendingList), what a step runs (StepPolicy), the running requests
and retraction (DecodeManager), structured output (ConstrainedReqs), speculative decoding
(SpeculativeReqs), who runs in a step sent ahead (OverlapRows), updates (StepOutputs). What stays
here is a request's life across them: admitted, stepped, finished or aborted. Each kind of work
(common/task.py) has one owner: generation is this core's, embedding (--task embed: prompts
pooled, not sampled) PoolingReqs'.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from msgspec.structs import replace

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch, StepResult
from zserve.common.histogram import Histogram
from zserve.common.messages import NO_TOKEN_IDS, PromptLogprobs, TokenOut
from zserve.common.pooling import Pooling
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_stats import SchedulerStats
from zserve.scheduler_proc.admission_policy import AdmissionPolicy
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.constrained_reqs import ConstrainedReqs
from zserve.scheduler_proc.decode_manager import DecodeManager
from zserve.scheduler_proc.grammar_source import GrammarSource
from zserve.scheduler_proc.invariants import check_pages, check_reqs
from zserve.scheduler_proc.kv_reservation import KvReservation
from zserve.scheduler_proc.overlap_rows import OverlapRows, WaitForResult
from zserve.scheduler_proc.pending_list import PendingList
from zserve.scheduler_proc.pooled_reqs import PoolingReqs
from zserve.scheduler_proc.prefill_adder import PrefillAdder
from zserve.scheduler_proc.req import PendingReq, Req
from zserve.scheduler_proc.req_intake import ReqIntake
from zserve.scheduler_proc.req_table import ReqTable
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch
from zserve.scheduler_proc.scheduler_knobs import SchedulerKnobs
from zserve.scheduler_proc.speculation import SpeculativeReqs
from zserve.scheduler_proc.step_outputs import StepOutputs, gather_prompt_scores, take_prompt_logprobs
from zserve.scheduler_proc.step_policy import STEP_POLICIES, StepPolicy

__all__ = ["STEP_POLICIES", "Scheduler", "SchedulerStats"]

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self, *, num_pages: int, page_size: int, context_len: int, eos_token_ids: Sequence[int], knobs: SchedulerKnobs,
        grammar_source: GrammarSource | None = None, on_pages_freed: Callable[[np.ndarray], None] | None = None,
        pooling: Pooling | None = None,
    ):
        """The sizes come from the model worker (`WorkerReady`); the policy knobs, speculative
        decoding's settings among them, from the server config (`scheduler_knobs`, the one source
        of their defaults). Without a `grammar_source` structured output is off. `on_pages_freed` is
        a test hook (see CacheManager). `pooling`: an embedding server's (--task embed; PoolingReqs)."""
        for name, value in {"num_pages": num_pages, "page_size": page_size, "context_len": context_len}.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.page_size = page_size
        self.context_len = context_len
        self._step_policy = StepPolicy(knobs.schedule_policy, knobs.max_prefill_tokens, knobs.max_step_ms)
        self._reservation = KvReservation(knobs.kv_reservation, page_size, knobs.schedule_conservativeness)
        self._pooled = PoolingReqs(pooling)
        self._cache = CacheManager(num_pages, page_size, self._pooled.prefix_cache(knobs.enable_radix_cache),
                                   on_pages_freed)
        self._req_table = ReqTable(knobs.max_running_requests)
        self._decode = DecodeManager(page_size)
        self._constrained = ConstrainedReqs(grammar_source)
        self._spec = SpeculativeReqs(knobs.speculative, knobs.max_prefill_tokens, page_size)
        assert knobs.overlap_schedule in ("on", "off"), "overlap_schedule_for() resolves auto with the worker's device"
        self._overlap = OverlapRows(knobs.overlap_schedule == "on" and pooling is None, knobs.speculative.enabled,
                                    self._constrained)
        self._pending = PendingList(
            max_queued_requests=knobs.max_queued_requests, prefill_max_requests=knobs.prefill_max_requests or None,
            admission=AdmissionPolicy(knobs.admission_policy, knobs.admission_lookahead, knobs.force_fifo_every),
            constrained=self._constrained, reservation=self._reservation, cache=self._cache, req_table=self._req_table,
        )
        self._intake = ReqIntake(
            context_len=context_len, page_size=page_size, num_pages=num_pages, eos_token_ids=eos_token_ids,
            seed=knobs.seed, pending=self._pending, constrained=self._constrained, lora_names=knobs.lora_names,
        )
        self.eos_token_ids = self._intake.eos_token_ids
        self._live: dict[int, PendingReq | Req] = {}  # every request that has not had its final update
        self._in_flight: deque[ScheduledBatch] = deque()  # oldest first: one, or two under overlap
        self._totals = SchedulerStats()

    # -- requests in and out -----------------------------------------------------------------

    def submit(
        self, req_id: int, input_ids: Sequence[int] | np.ndarray, params: SamplingParams, num_copies: int = 1,
    ) -> list[TokenOut]:
        """Queue the request's `num_copies` copies (n choices of one prompt: req_ids req_id ..
        req_id + n - 1; see ReqIntake). Returns an ERROR update for each copy refused at once."""
        queued, refused = self._intake.submit(req_id, input_ids, params, num_copies, self._live)
        self._totals.num_submitted += num_copies
        for pending in queued:
            self._live[pending.req_id] = pending
        return [self._refused(copy_id, code, error) for copy_id, code, error in refused]

    def poll_grammars(self) -> list[TokenOut]:
        """Requests whose grammar is built join the queue, in arrival order; one whose grammar
        failed ends with its ERROR update. Call it before each next_batch()."""
        return [self._refused(p.req_id, code, error, queued=True) for p, code, error in self._pending.poll()]

    def abort(self, req_id: int, finish_reason: FinishReason = FinishReason.ABORT) -> list[TokenOut]:
        """End a request in any state with `finish_reason` (ABORT, or STOP for a stop string the
        detokenizer found). Unknown or already finished ids get []."""
        entry = self._live.get(req_id)
        if entry is None:
            return []
        self._forget(req_id)
        if isinstance(entry, PendingReq):
            self._pending.remove(entry)
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
        num_cached = entry.num_cached_tokens or 0  # a PendingReq has one only after a retraction
        return [TokenOut(
            req_id=entry.req_id, token_ids=NO_TOKEN_IDS, finish_reason=finish_reason, num_cached_tokens=num_cached,
        )]

    # -- one step ----------------------------------------------------------------------------

    def next_batch(self) -> ForwardBatch | None:
        """The next step; None when there is nothing to run, or (a step in flight) nothing that can
        run before its result."""
        if self._in_flight and not self._can_overlap():
            return None
        if not len(self._decode):
            self._reservation.on_idle()
        try:
            decode_reqs, adder = self._step_policy.choose(
                len(self._decode), self._schedule_prefill, self._schedule_decode
            )
        except WaitForResult:
            return None
        if decode_reqs:  # after the prefill part: prompts come first
            self._spec.plan(decode_reqs, adder.extend_lens if adder else [], self._cache, self._pending.num_chunk_pages)
        if adder is None and not decode_reqs:
            assert self._in_flight or (not self._pending.ready and self._pending.chunked is None), (
                "scheduler stalled: requests wait while nothing runs"
            )
            return None
        batch = ScheduledBatch(
            self._totals.num_steps, decode_reqs, adder.reqs if adder else [], adder.extend_lens if adder else [],
            adder.kv_source if adder else [],
        )
        for req in batch.reqs:
            req.in_flight += 1  # an abort now only marks it: the worker is using its pages
        self._totals.num_overlapped_steps += bool(self._in_flight)
        self._in_flight.append(batch)
        self._totals.num_steps += 1
        self._totals.num_running_peak = max(self._totals.num_running_peak, len(self._decode))
        forward_batch = batch.to_forward_batch(self._req_table)
        forward_batch.grammar = self._constrained.masks(batch.sampled_req_ids()) if len(self._constrained) else None
        forward_batch.pooling = self._pooled.mode
        return forward_batch

    def on_result(self, result: StepResult) -> list[TokenOut]:
        """The oldest step in flight is back."""
        assert self._in_flight and result.step_id == self._in_flight[0].step_id, (
            f"result for step {result.step_id}, in flight: {[b.step_id for b in self._in_flight]}"
        )
        batch = self._in_flight.popleft()
        outputs = StepOutputs.of(result)
        assert len(outputs) == len(batch.reqs), f"step {batch.step_id}: {len(outputs)} rows, {len(batch.reqs)} reqs"
        num_decode = len(batch.decode_reqs)
        self._totals.num_decoded_tokens += num_decode
        self._totals.num_prefilled_tokens += batch.num_prefilled_tokens
        if result.prompt_logprobs is not None:
            gather_prompt_scores(batch, result)
        self._on_decoded(batch.decode_reqs, outputs, self._spec.num_accepted(batch, result))
        if self._pooled.is_on:
            return self._pooled.on_result(batch, result, self._release, self._finish)
        self._on_prefilled(batch, outputs, first_row=num_decode)
        self._totals.num_generated_tokens += len(outputs.updates) + outputs.num_extra_tokens
        return outputs.updates

    def _on_decoded(self, reqs: list[Req], outputs: StepOutputs, num_accepted: list[int] | None) -> None:
        """The hot path: one new token for each running request (rows 0 .. len(reqs) - 1), more
        for one with drafts (`num_accepted` per row then)."""
        for i, req in enumerate(reqs):
            req.in_flight -= 1
            accepted = self._spec.verified(req, num_accepted[i]) if req.drafts else None
            if req.is_aborted:  # its final update is sent: drop the tokens, free it with its last step in flight
                if OverlapRows.is_fed(req):  # the step after was fed this token: its K/V there is this token's
                    OverlapRows.take(req, outputs.token_id_list[i])
                if not req.in_flight:
                    req.cached_len = req.seq_len  # every token fed has its K/V; any drafts' pages go with the rest
                    self._release(req)
                continue
            self._take_tokens(req, outputs, i, accepted)

    def _on_prefilled(self, batch: ScheduledBatch, outputs: StepOutputs, first_row: int) -> None:
        """Prefill chunks, rows `first_row` on: a finished prompt gives the first token (the
        request's first update)."""
        prefilled = zip(batch.prefill_reqs, batch.prefill_extend_lens, batch.prefill_is_sampled, strict=True)
        for row, (req, extend_len, sampled) in enumerate(prefilled, start=first_row):
            req.in_flight -= 1
            req.cached_len += extend_len
            if req.is_aborted:
                self._release(req)
            elif not sampled:  # prompt left: share what is computed so far, say nothing yet
                self._cache.cache_req(req)
            elif self._take_tokens(req, outputs, row, prompt=take_prompt_logprobs(req)) is None:
                self._cache.cache_req(req)
                self._decode.add(req)

    def _take_tokens(
        self, req: Req, outputs: StepOutputs, row: int, drafts: list[int] | None = None,
        prompt: PromptLogprobs | None = None,
    ) -> FinishReason | None:
        """The one way sampled tokens enter a request: a drafted row's accepted `drafts` (None: no
        drafts), then the token sampled at `row`, each through the finish checks (those after a
        finishing one are dropped). Its K/V then counts all but the new last token (a drafted row's
        pages past that go back); its update goes to `outputs`; a token that ends it finishes it."""
        new_ids = [outputs.token_id_list[row]] if drafts is None else [*drafts, outputs.token_id_list[row]]
        if OverlapRows.is_fed(req):  # the step after was fed this token (overlap): it takes the future token's place
            req.output_ids.pop()
        for i, token_id in enumerate(new_ids):
            req.output_ids.append(token_id)
            self._constrained.accept(req.req_id, req.output_ids)
            if (finish_reason := req.finish_reason()) is not None:
                del new_ids[i + 1 :]
                break
        req.cached_len = req.seq_len - 1  # the K/V of every token but its new last one
        if drafts is not None:
            self._cache.trim_req(req)
        outputs.add(req, row, finish_reason, prompt=prompt, token_ids=None if drafts is None else new_ids)
        if finish_reason is not None:
            self._finish(req, finish_reason)
        return finish_reason

    # -- state -------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Anything to run, or to wait for (a grammar being built: poll again)."""
        pending = self._pending
        return bool(pending) or pending.chunked is not None or len(self._decode) > 0 or bool(self._in_flight)

    @property
    def overlaps(self) -> bool:
        """Whether next_batch() may be called with a step in flight (overlap scheduling)."""
        return self._overlap.is_on

    @property
    def num_in_flight(self) -> int:
        """Steps sent and not yet back (0, 1, or 2 under overlap)."""
        return len(self._in_flight)

    @property
    def waits_for_grammars_only(self) -> bool:
        """Nothing can run until a grammar is built: the process loop may sleep a little."""
        pending = self._pending
        return bool(pending.building) and not pending.ready and pending.chunked is None and not len(self._decode)

    def stats(self) -> SchedulerStats:
        cache = self._cache
        return replace(
            self._totals, num_waiting=len(self._pending), num_prefilling=int(self._pending.chunked is not None),
            num_running=len(self._decode), num_free_pages=cache.num_free_pages, num_cached_pages=cache.num_cached_pages,
            num_evictable_pages=cache.num_evictable_pages,
            num_used_pages=cache.num_pages - cache.num_free_pages - cache.num_cached_pages,
            num_reserved_pages=self._num_reserved_pages(), new_token_ratio=self._reservation.new_token_ratio,
            prefill_chunk_tokens=self._step_policy.time_bound.last_budget_tokens,
            **self._spec.totals(),
        )

    def record_step_time(self, wait_s: float, schedule_s: float, forward_s: float = 0.0) -> None:
        """The process loop's timing of one step (before its on_result): waiting for the worker, the scheduler's own
        time before it (0 after an idle gap), the worker's forward inside the wait. Totals in stats()."""
        self._totals.step_wait_s += wait_s
        self._totals.schedule_s += schedule_s
        self._totals.worker_forward_s += forward_s
        if self._in_flight:
            self._step_policy.observe(self._in_flight[0], forward_s * 1e3)  # the chunk's cost per token (--max-step-ms)

    def histograms(self) -> dict[str, Histogram]:
        return {"queue_time_seconds": self._pending.queue_time_s}

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant: every page is free, cached,
        or owned by one live request; every row is free or owned; reservations add up (see invariants.py)."""
        holders = {id(r): r for r in self._live.values() if isinstance(r, Req)}
        for batch in self._in_flight:  # requests ended in flight hold pages until on_result
            holders.update((id(r), r) for r in batch.reqs)
        reqs = list(holders.values())
        self._cache.check_integrity(reqs)
        self._req_table.check_integrity({r.row_idx: r.req_id for r in reqs})
        self._decode.check_integrity()
        self._pending.check_integrity(self._live)
        self._constrained.check_integrity(self._live)
        self._spec.check_integrity(self._live)
        self._pooled.check_integrity(self._live, len(self._decode))
        check_reqs(reqs, self._decode, self._pending.chunked, self._live, page_size=self.page_size,
                   batch_in_flight=bool(self._in_flight))
        num_reserved_pages = self._num_reserved_pages() if self._reservation.is_full else None
        check_pages(self._cache.num_available_pages, self._pending.num_chunk_pages, num_reserved_pages,
                    self._totals.num_retracted)

    # -- internals ---------------------------------------------------------------------------

    def _refused(self, req_id: int, code: ErrorCode, error: str, queued: bool = False) -> TokenOut:
        """The ERROR update of a request refused at submit, or (`queued`) whose grammar failed."""
        logger.info("req %d refused (%s): %s", req_id, code.text, error)
        self._totals.num_refused += 1
        if queued:
            self._forget(req_id)
        return TokenOut(req_id=req_id, token_ids=NO_TOKEN_IDS, finish_reason=FinishReason.ERROR, code=code, error=error)

    def _schedule_prefill(self, token_budget: int) -> PrefillAdder | None:
        """The prefill part of this step (PendingList), or None when nothing can be prefilled."""
        adder = self._pending.schedule_prefill(token_budget, self._num_reserved_pages)
        for req in adder.admitted if adder is not None else ():
            self._live[req.req_id] = req
            self._totals.num_prompt_tokens += req.num_prompt_tokens
            self._totals.num_prefix_hit_tokens += req.cached_len  # this admission's hit (on_result moves it on)
        return adder

    def _can_overlap(self) -> bool:
        """A step can be built while the one in flight runs (OverlapRows): overlap is on, one step is in flight,
        and it does not hold the ChunkedReq (whose next chunk starts where that step's ends)."""
        chunked = self._pending.chunked
        return self._overlap.is_on and len(self._in_flight) == 1 and (chunked is None or not chunked.req.in_flight)

    def _schedule_decode(self) -> list[Req]:
        """Every running request with a page for this step's token, after any retraction it took;
        with a step in flight, those of them OverlapRows lets run (WaitForResult: none can before its result)."""
        if not len(self._decode):
            return []
        if self._in_flight:
            return self._schedule_decode_ahead()
        reqs, num_retracted = self._decode.schedule_decode(
            self._cache, lambda: self._pending.num_chunk_pages, self._retract
        )
        if num_retracted:
            self._reservation.on_retracted()
        else:
            self._reservation.on_decode_step()
        return reqs

    def _schedule_decode_ahead(self) -> list[Req]:
        reqs = self._overlap.ahead(self._decode.reqs, self._in_flight[0])
        if self._decode.alloc_step_pages(reqs, self._cache, self._pending.num_chunk_pages) is None:
            OverlapRows.unfeed(reqs)
            raise WaitForResult  # a retraction needs the result: the request's prompt takes its last token
        if reqs:
            self._reservation.on_decode_step()
        return reqs

    def _retract(self, req: Req | None) -> None:
        """Put `req` back at the head of the queue; what it computed stays in the radix cache.
        None: only the oldest runs and it still gets no page, so the ChunkedReq gives way."""
        if req is None:
            assert self._pending.chunked is not None, "the oldest running request alone finds no page"
            req = self._pending.chunked.req
        num_kept_tokens = req.cached_len // self.page_size * self.page_size if self._cache.enable_radix_cache else 0
        pending = req.retracted()
        self._release(req)
        self._pending.add_retracted(pending)
        self._live[req.req_id] = pending
        self._totals.num_retracted += 1
        logger.info("req %d retracted: %d of its %d tokens kept in the cache, %d running",
                    req.req_id, num_kept_tokens, req.seq_len, len(self._decode))

    def _num_reserved_pages(self) -> int:
        """Pages the KvReservation keeps promised to admitted requests and not yet allocated (the
        running ones and the ChunkedReq; outside a step nobody else holds a reservation, and with a step
        in flight its prompts finishing there do too)."""
        chunked = [] if self._pending.chunked is None else [self._pending.chunked.req]
        holders = [*self._decode.reqs, *chunked]
        for batch in self._in_flight:
            holders.extend(r for r in batch.prefill_reqs if not r.is_aborted and r not in chunked)
        return self._reservation.num_reserved_pages(holders)

    def _finish(self, req: Req, finish_reason: FinishReason) -> None:
        # the frontend logs it at INFO, with latencies
        logger.debug("req %d finished (%s): %d output tokens", req.req_id, finish_reason.text, len(req.output_ids))
        self._forget(req.req_id)
        self._totals.num_finished += 1
        if req.in_flight:  # fed to the step after (overlap): freed with that step's result, its token dropped
            req.is_aborted = True
            self._detach(req)
        else:
            self._release(req)

    def _forget(self, req_id: int) -> None:
        """`req_id` has had (or is given now) its final update: it leaves the live table, and its grammar goes."""
        del self._live[req_id]
        self._constrained.release(req_id)
        self._spec.release(req_id)

    def _detach(self, req: Req) -> None:
        """Take `req` out of the running set or the ChunkedReq place; it keeps its pages."""
        if self._decode.holds(req):
            self._decode.remove(req)
        self._pending.detach(req)

    def _release(self, req: Req) -> None:
        """Detach `req`, cache what it computed, free the rest and its row."""
        self._detach(req)
        self._cache.release_req(req)
        self._req_table.free(req.row_idx, req.req_id)
