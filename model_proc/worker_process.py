"""A model worker process: one tensor-parallel rank (the only rank when --tp-size is 1).

    rank 0:    recv batch from the scheduler -> fill in its future tokens (overlap scheduling:
               the ids the last step sampled, FutureTokens) -> re-broadcast it to the followers
               -> ModelRunner.run -> send StepResult                               (forever)
               (idle for 0.5 s: a heartbeat to the followers instead; idle for 1 s after a
               step: the heap's freed pages handed back, process_memory.IdleHeapRelease)
    rank 1..:  recv batch from rank 0 -> ModelRunner.run, result dropped           (until rank 0 stops)

Every rank runs every forward (the layers' collectives keep them in step); only rank 0 talks
to the scheduler, so only rank 0's sampled tokens are used and sampling cannot diverge.
A batch the runner refuses (e.g. a page outside the pool) is refused alike by every rank,
before any collective; rank 0 answers it with WorkerError naming the problem.

Failure: a rank that dies breaks the next collective of the others (gloo raises), a follower
whose connection drops makes rank 0 exit, and a follower that hears nothing from rank 0 for
10 s exits; the launcher of each node sees its ranks exit and stops the node.
"""

from __future__ import annotations

import logging
import os
import time

import zmq

from zserve.common.forward_batch import ForwardBatch, StepResult
from zserve.common.messages import (
    LAUNCHER_INBOX,
    RANK_BROADCAST,
    WORKER_INBOX,
    WORKER_TO_SCHEDULER,
    ProcReady,
    WorkerError,
    WorkerReady,
)
from zserve.common.proc_runtime import child_args, child_setup
from zserve.common.rank_layout import RankLayout
from zserve.common.start_phases import StartPhases
from zserve.common.transport import Addresses, Endpoint, pull, push
from zserve.model_proc.batch_broadcast import HEARTBEAT_INTERVAL_S, BatchPublisher, BatchSubscriber
from zserve.model_proc.checkpoints.early_cache_read import EarlyCacheRead
from zserve.model_proc.future_tokens import FutureTokens
from zserve.model_proc.process_memory import IdleHeapRelease
from zserve.model_proc.worker_sections import WorkerSections

logger = logging.getLogger("model_proc")

HEAP_RELEASE_IDLE_S = 1.0  # a worker with no batch this long after a step hands its freed heap pages back


def build_runner(sections: WorkerSections, rank: int, phases: StartPhases, early_read: EarlyCacheRead | None):
    from zserve.model_proc.model_runner import ModelRunner

    phases.done("model code imports")
    return ModelRunner(sections.model, sections.cache, sections.kernels, sections.place(rank), start_phases=phases,
                       early_cache_read=early_read)


def run_step(runner, batch: ForwardBatch) -> StepResult | WorkerError:
    try:
        return runner.run(batch)
    except ValueError as exc:
        return WorkerError(step_id=batch.step_id, message=str(exc))


def lead(runner, inbox: Endpoint, results: Endpoint, publisher: BatchPublisher | None,
         heap: IdleHeapRelease | None = None) -> None:
    """Rank 0's loop."""
    heartbeat_ms = int(HEARTBEAT_INTERVAL_S * 1000) if publisher else None
    first_batch = True
    future = FutureTokens()
    while True:
        waits_ms = [ms for ms in (heartbeat_ms, heap.wait_ms() if heap else None) if ms is not None]
        got = inbox.recv_frame(min(waits_ms) if waits_ms else None)
        if got is None:
            if publisher:
                publisher.heartbeat()
            if heap:
                heap.on_idle()
            continue
        frame, batch = got
        try:
            filled = future.fill(batch)  # overlap scheduling: the ids the last step sampled
        except ValueError as exc:
            future.forget()
            logger.error("refused batch %d: %s", batch.step_id, exc)
            results.send(WorkerError(step_id=batch.step_id, message=str(exc)))
            continue
        if publisher:
            publisher.publish(frame if filled is batch else RANK_BROADCAST.encode(filled), batch.step_id)
        batch = filled
        t0 = time.perf_counter()
        reply = run_step(runner, batch)
        if isinstance(reply, WorkerError):
            future.forget()
        else:
            future.remember(reply)
        if heap:
            heap.step_done()
        if first_batch:  # the start line's last piece: what the first request pays beyond a later one
            first_batch = False
            logger.info("first batch: %d tokens of %d requests in %.2f s", batch.num_tokens, batch.num_reqs,
                        time.perf_counter() - t0)
        if isinstance(reply, WorkerError):
            logger.error("refused batch %d: %s", reply.step_id, reply.message)
        results.send(reply)


def follow(runner, subscriber: BatchSubscriber) -> None:
    """A follower's loop: returns when rank 0 stops cleanly."""
    while (batch := subscriber.next_batch()) is not None:
        run_step(runner, batch)  # rank 0 reports the result, or the refusal


def serve_lead(
    sections: WorkerSections, addrs: Addresses, runner, ctx: zmq.Context, launcher: Endpoint, name: str,
    phases: StartPhases,
) -> None:
    tp_size = sections.parallel.tp_size
    inbox = pull(ctx, addrs.worker_inbox, WORKER_INBOX)
    results = push(ctx, addrs.worker_results, WORKER_TO_SCHEDULER)
    publisher = BatchPublisher(ctx, addrs.rank_broadcast, tp_size - 1) if tp_size > 1 else None
    error = None  # why rank 0 stopped, for the followers; None on SIGTERM (SystemExit)
    try:
        if publisher:
            publisher.wait_for_followers(sections.frontend.startup_timeout_s)
        info = runner.info()
        results.send(WorkerReady(**info, memory=runner.memory))
        phases.done("ready")
        launcher.send(ProcReady(name=name, pid=os.getpid(), info=info, start_phases=phases.durations_s))
        logger.info("model worker ready (%d ranks): %s", tp_size, info)
        lead(runner, inbox, results, publisher, IdleHeapRelease(HEAP_RELEASE_IDLE_S))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if publisher:
            publisher.close(error)


def serve_follower(
    addrs: Addresses, runner, ctx: zmq.Context, launcher: Endpoint, name: str, phases: StartPhases
) -> None:
    subscriber = BatchSubscriber(ctx, addrs.rank_broadcast)
    phases.done("ready")
    launcher.send(ProcReady(name=name, pid=os.getpid(), info={}, start_phases=phases.durations_s))
    logger.info("%s ready, following rank 0 on %s", name, addrs.rank_broadcast)
    follow(runner, subscriber)
    logger.info("rank 0 stopped; %s exits", name)


def serve(
    sections: WorkerSections, addrs: Addresses, rank: int, phases: StartPhases, early_read: EarlyCacheRead | None = None
) -> None:
    """`phases`: this process's start timeline, sent to the launcher in ProcReady; `early_read`: the
    packed cache being read since the process started (checkpoints/early_cache_read.py), or None."""
    from zserve.model_proc.compute_dtype import resolve_dtype
    from zserve.model_proc.tp_group import (
        check_same_on_all_ranks,
        rank_device,
        settings_fingerprint,
        tp_group,
    )

    model, parallel, cache = sections.model, sections.parallel, sections.cache
    layout = RankLayout.from_config(parallel)
    device = rank_device(parallel.device, layout.local_index(rank), parallel.tp_size)
    name = layout.child_name(rank)
    ctx = zmq.Context()
    phases.done("torch import")
    try:
        launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
        with tp_group(addrs.dist_init, rank, parallel.tp_size, device, sections.frontend.startup_timeout_s):
            if parallel.tp_size > 1:
                # the resolved dtype: `auto` may differ between nodes whose CPUs differ
                fingerprint = settings_fingerprint(
                    model.model, dtype=str(resolve_dtype(model.dtype, device)[0]), page_size=cache.page_size,
                    kv_cache_tokens=cache.kv_cache_tokens, kv_memory_fraction=cache.kv_memory_fraction,
                    mem_fraction_static=cache.mem_fraction_static, kv_cache_dtype=cache.kv_cache_dtype,
                    seed=model.seed, tp_size=parallel.tp_size,
                    nnodes=parallel.nnodes, quantization=model.quantization,
                )
                check_same_on_all_ranks(
                    fingerprint, device,
                    "models or --dtype/--quantization/--page-size/--kv-cache-tokens/--kv-memory-fraction/"
                    "--kv-cache-dtype/--seed",
                )
            runner = build_runner(sections, rank, phases, early_read)
            if rank == 0:
                serve_lead(sections, addrs, runner, ctx, launcher, name, phases)
            else:
                serve_follower(addrs, runner, ctx, launcher, name, phases)
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    phases = StartPhases.since_process_start()
    cfg, addrs, ns = child_args()
    sections = WorkerSections.of(cfg)  # what this process reads of the config
    tp_size = sections.parallel.tp_size
    child_setup("model" if tp_size == 1 else f"model r{ns.rank}", sections.frontend.log_level)
    # the packed cache (warm or cold) is read into memory while torch imports and the model is built
    model = sections.model
    early_read = EarlyCacheRead.start(model.model, ns.rank, tp_size) if model.packed_cache == "on" else None
    serve(sections, addrs, ns.rank, phases, early_read)
