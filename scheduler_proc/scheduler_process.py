"""The scheduler process: the scheduler core's loop between the inbox and the model worker.

    loop:
        drain the inbox (block only when there is no work)
        batch = scheduler.next_batch()
        if batch: send it, wait for its result, publish the TokenOuts
        else if idle: check integrity
        every --log-stats-interval-s while busy: one stats line

Only one batch is in flight (no overlap scheduling yet), so the scheduler's state is never
touched while the worker is writing to pages it might free.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import asdict, replace

import numpy as np
import zmq

from zserve.common.context_limit import served_context_len
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
from zserve.common.proc_runtime import child_args, child_setup
from zserve.common.sampling_params import SamplingParams
from zserve.common.server_config import ServerConfig
from zserve.common.transport import Addresses, Endpoint, pull, push
from zserve.scheduler_proc.grammar_manager import GrammarError, GrammarManager
from zserve.scheduler_proc.scheduler import Scheduler
from zserve.scheduler_proc.scheduler_knobs import scheduler_knobs
from zserve.scheduler_proc.stats_logger import StatsLogger

logger = logging.getLogger("scheduler_proc")
COMPILE_POLL_MS = 5  # how often a loop with requests waiting for their grammar looks again


class SchedulerLoop:
    def __init__(
        self, scheduler: Scheduler, inbox: Endpoint, to_worker: Endpoint, from_worker: Endpoint, to_detok: Endpoint,
        stats_logger: StatsLogger, grammar: GrammarManager | None = None,
    ):
        self.scheduler = scheduler
        self.stats_logger = stats_logger
        self.inbox = inbox
        self.to_worker = to_worker
        self.from_worker = from_worker
        self.to_detok = to_detok
        self.grammar = grammar
        self.compiling: list[tuple[int, np.ndarray, SamplingParams, Future]] = []  # waiting for their grammar
        self.checked_idle = True

    def run_forever(self) -> None:
        last_result_s: float | None = None  # when the last result came back, unless the loop idled since
        while True:
            self.drain_inbox(block=not self.scheduler.has_work)
            self.queue_compiled()
            batch = self.scheduler.next_batch()
            if batch is not None:
                last_result_s = self.run_step(batch, last_result_s)
            else:
                last_result_s = None
                self.check_if_idle()
            self.log_stats()

    def run_step(self, batch: ForwardBatch, last_result_s: float | None) -> float:
        """Send `batch`, wait for its result, publish the TokenOuts; returns when the result came.
        The time waited and the scheduler's own time since the last result go into its stats."""
        self.checked_idle = False
        if self.grammar is not None:
            batch.grammar = self.grammar.masks(self.scheduler.in_flight_sampled_req_ids())
        sent_s = time.perf_counter()
        self.to_worker.send(batch)
        result = self.wait_result(batch.step_id)
        received_s = time.perf_counter()
        self.scheduler.record_step_time(received_s - sent_s, sent_s - last_result_s if last_result_s is not None else 0.0)
        self.publish(self.scheduler.on_result(result))
        return received_s

    def check_if_idle(self) -> None:
        if not self.scheduler.has_work and not self.checked_idle:
            self.scheduler.check_integrity()
            self.checked_idle = True

    def drain_inbox(self, block: bool) -> None:
        """Handle what is waiting; when `block`, wait for a message first (or until a stats line
        is due, when one is still owed for the last busy interval)."""
        timeout_ms = self.idle_wait_ms() if block else 0
        if self.compiling and (timeout_ms is None or timeout_ms > COMPILE_POLL_MS):  # a grammar may be ready any moment
            timeout_ms = COMPILE_POLL_MS
        msg = self.inbox.recv(timeout_ms=timeout_ms)
        if timeout_ms is None:  # woke from idle: the next stats interval starts now
            self.stats_logger.restart(time.monotonic(), self.scheduler.stats())
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
            if not self.abort_compiling(msg.req_id):
                self.publish(self.scheduler.abort(msg.req_id, msg.finish_reason))
        elif isinstance(msg, StatsReq):
            self.to_detok.send(StatsOut(req_id=msg.req_id, stats=asdict(self.scheduler.stats()), histograms=self.scheduler.histograms()))

    def submit(self, msg: TokenizedReq) -> None:
        """Queue a request's copies (n choices of one prompt) together, so one round admits them
        and the prompt is computed once (the PrefillAdder's copies); copy i draws with seed + i."""
        for i in range(msg.num_copies):
            params = msg.params if i == 0 or msg.params.seed is None else replace(msg.params, seed=(msg.params.seed + i) % 2**63)
            if params.grammar is not None and self.grammar is None:
                self.to_detok.send(ReqOutput.final(
                    msg.req_id + i, FinishReason.ERROR, code=ErrorCode.INVALID, prompt_tokens=len(msg.input_ids),
                    error="structured output is off on this server (--grammar-backend none)",
                ))
            elif params.grammar is not None:  # queued once its grammar is compiled
                self.compiling.append((msg.req_id + i, msg.input_ids, params, self.grammar.compile(params.grammar)))
            else:
                self.submit_one(msg.req_id + i, msg.input_ids, params)

    def queue_compiled(self) -> None:
        """Queue the requests whose grammar is compiled (in arrival order); fail those whose
        grammar could not be."""
        if not self.compiling:
            return
        waiting = []
        for req_id, input_ids, params, future in self.compiling:
            if not future.done():
                waiting.append((req_id, input_ids, params, future))
                continue
            error = future.exception()
            if error is not None:
                code = ErrorCode.INVALID if isinstance(error, GrammarError) else ErrorCode.INTERNAL
                logger.info("req %d refused: %s", req_id, error)
                self.to_detok.send(ReqOutput.final(req_id, FinishReason.ERROR, code=code, error=str(error), prompt_tokens=len(input_ids)))
                continue
            self.grammar.start(req_id, future.result())
            if not self.submit_one(req_id, input_ids, params):
                self.grammar.drop(req_id)
        self.compiling = waiting

    def abort_compiling(self, req_id: int) -> bool:
        """End a request still waiting for its grammar; False when it is not one."""
        for i, (waiting_id, input_ids, _, _) in enumerate(self.compiling):
            if waiting_id == req_id:
                del self.compiling[i]
                self.to_detok.send(ReqOutput.final(req_id, FinishReason.ABORT, prompt_tokens=len(input_ids)))
                return True
        return False

    def submit_one(self, req_id: int, input_ids, params) -> bool:
        """Register an accepted request with the detokenizer; a refused one is never registered,
        so its one output (with its prompt count, which DetokRegister would have carried) goes
        through the detokenizer whole."""
        msg = TokenizedReq(req_id=req_id, input_ids=input_ids, params=params)
        num_prompt_tokens = len(msg.input_ids)
        try:
            refusal = self.scheduler.submit(msg.req_id, msg.input_ids, msg.params)
        except Exception as exc:  # raised before it is queued: this request alone fails, the scheduler serves on
            logger.exception("req %d: submit failed", msg.req_id)
            self.to_detok.send(ReqOutput.final(
                msg.req_id, FinishReason.ERROR, code=ErrorCode.INTERNAL, prompt_tokens=num_prompt_tokens,
                error=f"the scheduler failed to take this request: {type(exc).__name__}: {exc}",
            ))
            return False
        if not refusal:
            self.to_detok.send(DetokRegister(req_id=msg.req_id, stop=list(msg.params.stop), num_prompt_tokens=num_prompt_tokens))
            return True
        (out,) = refusal
        self.to_detok.send(ReqOutput.final(
            msg.req_id, FinishReason.ERROR, code=out.code, error=out.error, prompt_tokens=num_prompt_tokens,
        ))
        return False

    def wait_result(self, step_id: int) -> StepResult:
        reply = self.from_worker.recv()
        if isinstance(reply, WorkerError):
            raise RuntimeError(f"model worker refused step {reply.step_id}: {reply.message}")
        assert isinstance(reply, StepResult) and reply.step_id == step_id, reply
        return reply

    def publish(self, outs: list[TokenOut]) -> None:
        if not outs:
            return
        if self.grammar is not None and self.grammar.matchers:
            for out in outs:
                self.grammar.accept(out.req_id, out.token_ids.tolist(), out.finish_reason is not None)
        self.to_detok.send(TokenOutBatch(outs=outs))


def serve(cfg: ServerConfig, addrs: Addresses) -> None:
    ctx = zmq.Context()
    try:
        inbox = pull(ctx, addrs.scheduler_inbox, SCHEDULER_INBOX)
        from_worker = pull(ctx, addrs.worker_results, WORKER_TO_SCHEDULER)
        to_worker = push(ctx, addrs.worker_inbox, WORKER_INBOX)
        to_detok = push(ctx, addrs.detok_inbox, DETOK_INBOX)
        launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
        ready = from_worker.recv()
        assert isinstance(ready, WorkerReady), ready
        context_len = served_context_len(ready.context_len, cfg.context_length)  # the worker says the model's maximum
        scheduler = Scheduler(
            num_pages=ready.num_pages,
            page_size=ready.page_size,
            context_len=context_len,
            eos_token_ids=ready.eos_token_ids,
            **scheduler_knobs(cfg),
        )
        launcher.send(ProcReady(name="scheduler", pid=os.getpid(), info={"num_pages": ready.num_pages}))
        logger.info(
            "scheduler ready: %d KV pages of %d tokens, context %d, policy %s/%s, budget %d tokens/step, %s KV reservation",
            ready.num_pages, ready.page_size, context_len, cfg.schedule_policy, cfg.admission_policy, cfg.max_prefill_tokens,
            cfg.kv_reservation,
        )
        pool_tokens = ready.num_pages * ready.page_size
        if pool_tokens < context_len:
            logger.warning(
                "the KV pool holds %d tokens, less than the context of %d: a request uses at most the pool "
                "(one without max_tokens stops there, with finish reason length)", pool_tokens, context_len,
            )
        gc.collect()
        gc.freeze()  # startup objects never need scanning again: shorter collector pauses in the loop
        stats_logger = StatsLogger(interval_s=cfg.log_stats_interval_s, num_pages=ready.num_pages)
        grammar = None
        if cfg.grammar_backend == "xgrammar":
            grammar = GrammarManager(cfg.tokenizer_dir, ready.vocab_size, list(ready.eos_token_ids))
            grammar.warm_up()
        SchedulerLoop(scheduler, inbox, to_worker, from_worker, to_detok, stats_logger, grammar).run_forever()
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    cfg, addrs, _ = child_args()
    child_setup("scheduler", cfg.log_level)
    serve(cfg, addrs)
