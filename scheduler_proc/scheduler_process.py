"""The scheduler process: the scheduler core's loop between the inbox and the model worker.

    loop:
        receive: handle the inbox (new requests, aborts); wait only when nothing can run
        publish what poll_grammars() says (a request whose grammar failed to build ends)
        batch = scheduler.next_batch()
        if batch: send it
        if a batch is in flight and (two are, or none was sent, or overlap is off):
            wait for the oldest one's result, publish the TokenOuts
        else if idle: check integrity
        every --log-stats-interval-s while busy: one stats line

The core (Scheduler) owns every request's life, structured output's grammars and n's copies
included; this loop only moves messages.

Overlap scheduling (on unless --disable-overlap-schedule): the next batch is built and sent while
the worker runs the one before, so the worker finds it queued when it is done; the core frees no
page a batch in flight still uses (scheduler_proc/overlap_rows.py). Off, one batch is in flight.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import deque
from dataclasses import replace

import zmq

from zserve.common.config_sections import ModelSection, SchedulerSection
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch, StepResult
from zserve.common.messages import (
    DETOK_INBOX,
    LAUNCHER_INBOX,
    SCHEDULER_INBOX,
    WORKER_INBOX,
    WORKER_TO_SCHEDULER,
    AbortReq,
    DetokRegister,
    ProcReady,
    ReqOutput,
    StatsOut,
    StatsReq,
    TokenizedReq,
    TokenOut,
    TokenOutBatch,
    WorkerError,
    WorkerReady,
)
from zserve.common.model_facts import ModelFacts
from zserve.common.proc_runtime import child_args, child_setup
from zserve.common.scheduler_choices import overlap_schedule_for
from zserve.common.transport import Addresses, Endpoint, pull, push
from zserve.common.weight_memory import WeightMemory
from zserve.scheduler_proc.scheduler import Scheduler
from zserve.scheduler_proc.scheduler_knobs import SchedulerKnobs, scheduler_knobs
from zserve.scheduler_proc.stats_logger import StatsLogger
from zserve.scheduler_proc.xgrammar_source import XGrammarSource, grammar_thread

logger = logging.getLogger("scheduler_proc")
GRAMMAR_POLL_MS = 5  # how often a loop with nothing to run but grammars being built looks again


class SchedulerLoop:
    def __init__(
        self, scheduler: Scheduler, inbox: Endpoint, to_worker: Endpoint, from_worker: Endpoint, to_detok: Endpoint,
        stats_logger: StatsLogger, worker_memory: WeightMemory | None = None,
    ):
        self.scheduler = scheduler
        self.worker_memory = worker_memory  # the model worker's weights and KV pool, for every StatsOut
        self.stats_logger = stats_logger
        self.inbox = inbox
        self.to_worker = to_worker
        self.from_worker = from_worker
        self.to_detok = to_detok
        self.checked_idle = True
        self.sent: deque[tuple[int, float]] = deque()  # (step_id, when sent) of each batch in flight, oldest first

    def run_forever(self) -> None:
        scheduler = self.scheduler
        last_result_s: float | None = None  # when the last result came back, unless the loop idled since
        while True:
            self.receive()
            self.publish(scheduler.poll_grammars())
            batch = scheduler.next_batch()
            if batch is not None:
                self.send(batch)
            if scheduler.num_in_flight and (batch is None or not scheduler.overlaps or scheduler.num_in_flight > 1):
                last_result_s = self.take_result(last_result_s)
            elif batch is None:
                last_result_s = None
                self.check_if_idle()
            self.log_stats()

    def send(self, batch: ForwardBatch) -> None:
        self.checked_idle = False
        self.sent.append((batch.step_id, time.perf_counter()))
        self.to_worker.send(batch)

    def take_result(self, last_result_s: float | None) -> float:
        """Wait for the oldest batch's result, publish its TokenOuts; returns when the result came.
        Into the stats: the time waited (from its send, or from the last result when the batch was
        sent ahead) and the scheduler's own time between the last result and the send."""
        step_id, sent_s = self.sent.popleft()
        waited_from_s = sent_s if last_result_s is None else max(sent_s, last_result_s)
        result = self.wait_result(step_id)
        received_s = time.perf_counter()
        schedule_s = max(0.0, sent_s - last_result_s) if last_result_s is not None else 0.0
        self.scheduler.record_step_time(received_s - waited_from_s, schedule_s, result.forward_ms / 1e3)
        self.publish(self.scheduler.on_result(result))
        return received_s

    def check_if_idle(self) -> None:
        if not self.scheduler.has_work and not self.checked_idle:
            self.scheduler.check_integrity()
            self.checked_idle = True

    def receive(self) -> None:
        """Handle what is waiting. With nothing to run, wait for a message first: until one comes
        (or a stats line still owed for the last busy interval is due), or a few ms while only
        grammars are being built."""
        scheduler = self.scheduler
        only_grammars = scheduler.waits_for_grammars_only
        timeout_ms = self.idle_wait_ms() if only_grammars or not scheduler.has_work else 0
        if only_grammars and (timeout_ms is None or timeout_ms > GRAMMAR_POLL_MS):
            timeout_ms = GRAMMAR_POLL_MS
        msg = self.inbox.recv(timeout_ms=timeout_ms)
        if timeout_ms is None:  # woke from idle: the next stats interval starts now
            self.stats_logger.restart(time.monotonic(), scheduler.stats())
        while msg is not None:
            self.handle(msg)
            msg = self.inbox.recv_nowait()

    def idle_wait_ms(self) -> int | None:
        due_s = self.stats_logger.due_in_s(time.monotonic())
        if due_s is None or not self.stats_logger.pending(self.scheduler.stats()):
            return None
        return int(due_s * 1000) + 1

    def log_stats(self) -> None:
        now_s = time.monotonic()
        if self.stats_logger.due_in_s(now_s) == 0.0:
            self.stats_logger.maybe_log(now_s, self.scheduler.stats())

    def handle(self, msg) -> None:
        if isinstance(msg, TokenizedReq):
            self.submit(msg)
        elif isinstance(msg, AbortReq):
            self.publish(self.scheduler.abort(msg.req_id, msg.finish_reason))
        elif isinstance(msg, StatsReq):
            self.to_detok.send(
                StatsOut(req_id=msg.req_id, scheduler=self.scheduler.stats(), histograms=self.scheduler.histograms(),
                         memory=self.worker_memory)
            )

    def submit(self, msg: TokenizedReq) -> None:
        """Hand the request (its n copies) to the scheduler and register each accepted copy with
        the detokenizer. A refused one is never registered, so its one output (with its prompt
        count, which DetokRegister would have carried) goes through the detokenizer whole."""
        num_prompt_tokens = len(msg.input_ids)
        copy_ids = range(msg.req_id, msg.req_id + msg.num_copies)
        try:
            outs = self.scheduler.submit(msg.req_id, msg.input_ids, msg.params, msg.num_copies)
            refused = {out.req_id: (out.code, out.error) for out in outs}
        except Exception as exc:  # this request alone fails, the scheduler serves on
            logger.exception("req %d: submit failed", msg.req_id)
            for copy_id in copy_ids:
                self.scheduler.abort(copy_id)  # a copy queued before the failure leaves again, unregistered
            error = f"the scheduler failed to take this request: {type(exc).__name__}: {exc}"
            refused = {copy_id: (ErrorCode.INTERNAL, error) for copy_id in copy_ids}
        for copy_id in copy_ids:
            refusal = refused.get(copy_id)
            if refusal is None:
                self.to_detok.send(DetokRegister(
                    req_id=copy_id, stop=list(msg.params.stop), num_prompt_tokens=num_prompt_tokens,
                    prompt_ids=msg.input_ids if msg.params.return_prompt_text else None,
                    skip_special_tokens=msg.params.skip_special_tokens, no_stop_trim=msg.params.no_stop_trim,
                ))
            else:
                code, error = refusal
                self.to_detok.send(ReqOutput.final(
                    copy_id, FinishReason.ERROR, code=code, error=error, prompt_tokens=num_prompt_tokens,
                ))

    def wait_result(self, step_id: int) -> StepResult:
        reply = self.from_worker.recv()
        if isinstance(reply, WorkerError):
            raise RuntimeError(f"model worker refused step {reply.step_id}: {reply.message}")
        assert isinstance(reply, StepResult) and reply.step_id == step_id, reply
        return reply

    def publish(self, outs: list[TokenOut]) -> None:
        if outs:
            self.to_detok.send(TokenOutBatch(outs=outs))


def serve(
    knobs: SchedulerKnobs, sched: SchedulerSection, model: ModelSection, addrs: Addresses, facts: ModelFacts,
) -> None:
    ctx = zmq.Context()
    try:
        inbox = pull(ctx, addrs.scheduler_inbox, SCHEDULER_INBOX)
        from_worker = pull(ctx, addrs.worker_results, WORKER_TO_SCHEDULER)
        to_worker = push(ctx, addrs.worker_inbox, WORKER_INBOX)
        to_detok = push(ctx, addrs.detok_inbox, DETOK_INBOX)
        launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
        # xgrammar's import starts now, while the model worker loads, not beside the first requests
        grammar_executor = grammar_thread() if sched.grammar_backend == "xgrammar" else None
        ready = from_worker.recv()
        assert isinstance(ready, WorkerReady), ready
        context_len = facts.context_len  # the launcher's, which the frontend checks prompts against too
        grammar_source = None
        if sched.grammar_backend == "xgrammar":
            grammar_source = XGrammarSource(
                model.tokenizer_dir, ready.vocab_size, list(ready.eos_token_ids), executor=grammar_executor
            )
            grammar_source.warm_up()
        knobs = replace(knobs, overlap_schedule=overlap_schedule_for(knobs.overlap_schedule, ready.device_type))
        scheduler = Scheduler(
            num_pages=ready.num_pages,
            page_size=ready.page_size,
            context_len=context_len,
            eos_token_ids=ready.eos_token_ids,
            knobs=knobs,
            grammar_source=grammar_source,
            pooling=facts.task.pooling,
        )
        launcher.send(ProcReady(name="scheduler", pid=os.getpid(), info={"num_pages": ready.num_pages}))
        logger.info(
            "scheduler ready: %d KV pages of %d tokens, context %d, policy %s/%s, budget %d tokens/step, "
            "%s KV reservation, overlap scheduling %s",
            ready.num_pages, ready.page_size, context_len, knobs.schedule_policy, knobs.admission_policy,
            knobs.max_prefill_tokens, knobs.kv_reservation, "on" if scheduler.overlaps else "off",
        )
        spec = knobs.speculative
        if spec.enabled:
            logger.info(
                "speculative decoding: %s drafts, up to %d per request per step, match windows %d..%d tokens, "
                "none in steps of %s decoding requests", spec.algorithm, spec.num_draft_tokens, spec.min_window,
                spec.max_window, f"{spec.disable_by_batch_size}+" if spec.disable_by_batch_size else "no count of",
            )
        pool_tokens = ready.num_pages * ready.page_size
        if pool_tokens < context_len:
            logger.warning(
                "the KV pool holds %d tokens, less than the context of %d: a request uses at most the pool "
                "(one without max_tokens stops there, with finish reason length)", pool_tokens, context_len,
            )
        gc.collect()
        gc.freeze()  # startup objects never need scanning again: shorter collector pauses in the loop
        stats_logger = StatsLogger(interval_s=sched.log_stats_interval_s, num_pages=ready.num_pages)
        SchedulerLoop(scheduler, inbox, to_worker, from_worker, to_detok, stats_logger, ready.memory).run_forever()
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    cfg, addrs, extra = child_args()
    child_setup("scheduler", cfg.log_level)
    serve(scheduler_knobs(cfg), cfg.section(SchedulerSection), cfg.section(ModelSection), addrs, extra.model_facts)
