"""The model worker process: receive a ForwardBatch, run it, send back the sampled tokens.

    recv batch -> ModelRunner.run -> send StepResult        (forever)

A batch the runner refuses (e.g. a page outside the pool) is answered with WorkerError naming
the problem; the scheduler treats that as an internal fault.
"""

from __future__ import annotations

import logging
import os

import zmq

from common.batch_messages import ForwardBatchMsg, StepResultMsg
from common.messages import (
    LAUNCHER_INBOX,
    WORKER_INBOX,
    WORKER_TO_SCHEDULER,
    ProcReady,
    WorkerError,
    WorkerReady,
)
from common.proc_runtime import child_args, child_setup
from common.server_config import ServerConfig
from common.transport import Addresses, pull, push

logger = logging.getLogger("model_proc")


def build_runner(cfg: ServerConfig, rank: int):
    from model_proc.model_runner import ModelRunner

    return ModelRunner.from_server_config(cfg, tp_rank=rank)


def serve(cfg: ServerConfig, addrs: Addresses, rank: int) -> None:
    runner = build_runner(cfg, rank)
    ctx = zmq.Context()
    inbox = pull(ctx, addrs.worker_inbox, WORKER_INBOX)
    results = push(ctx, addrs.worker_results, WORKER_TO_SCHEDULER)
    launcher = push(ctx, addrs.launcher_inbox, LAUNCHER_INBOX)
    info = runner.info()
    results.send(WorkerReady(**info))
    launcher.send(ProcReady("model", os.getpid(), info))
    logger.info("model worker ready: %s", info)
    try:
        while True:
            msg = inbox.recv()
            assert isinstance(msg, ForwardBatchMsg)
            try:
                result = runner.run(msg.batch)
            except ValueError as exc:
                logger.error("refused batch %d: %s", msg.batch.step_id, exc)
                results.send(WorkerError(msg.batch.step_id, str(exc)))
                continue
            results.send(StepResultMsg(result))
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    cfg, addrs, ns = child_args()
    child_setup("model", cfg.log_level)
    serve(cfg, addrs, ns.rank)
