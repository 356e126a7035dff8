"""`launch_server` / `python -m launcher`."""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import replace

from common.context_limit import context_length_error
from common.proc_runtime import setup_logging
from common.rank_layout import RankLayout
from common.server_config import ServerConfig
from launcher.cli import parse_config
from launcher.launcher import Launcher, StartupError

logger = logging.getLogger("launcher")


def check_flags(cfg: ServerConfig) -> None:
    """Refuse values no model could make right, before the model is even fetched."""
    if cfg.prefill_max_requests < 0:
        raise ValueError(f"--prefill-max-requests must be >= 0 (0 = no cap), got {cfg.prefill_max_requests}")
    if not cfg.schedule_conservativeness > 0:
        raise ValueError(f"--schedule-conservativeness must be > 0, got {cfg.schedule_conservativeness}")
    if cfg.context_length < 0:
        raise ValueError(f"--context-length must be >= 0 (0 = the model's maximum), got {cfg.context_length}")


def resolve_model(cfg: ServerConfig) -> ServerConfig:
    if cfg.model:
        return cfg
    from launcher.demo_model import ensure_demo_model

    return replace(cfg, model=str(ensure_demo_model(progress=True)))


def resolve_ranks(cfg: ServerConfig) -> tuple[ServerConfig, RankLayout]:
    """Check the rank flags against each other and the model, and --context-length against the
    model (before any process starts); fix the threads of each rank: --num-threads 0 shares this
    node's among its ranks."""
    from common.model_config import ModelConfig

    layout = RankLayout.from_config(cfg)
    hf = ModelConfig.from_model_dir(cfg.model)
    layout.check_model(hf.num_heads, hf.num_kv_heads, hf.intermediate_size)
    error = context_length_error(cfg.context_length, hf.context_len)
    if error is not None:
        raise ValueError(error)
    return replace(cfg, num_threads=layout.threads_per_rank(cfg.num_threads)), layout


def ready_line(cfg: ServerConfig, launcher: Launcher, port: int | None) -> str:
    layout = launcher.layout
    if not layout.is_head_node:
        ranks = ", ".join(str(r) for r in layout.local_ranks)
        return f"zserve node {layout.node_rank} ready: model ranks {ranks} of {layout.tp_size} joined node 0 at {cfg.dist_init_addr}"
    http = launcher.ready.get("http")
    http_note = f"; HTTP on {http.info['url']}" if http is not None else ""
    tp_note = f"; {layout.tp_size} tensor-parallel ranks on {layout.nnodes} node(s)" if layout.tp_size > 1 else ""
    return f"zserve ready: model {cfg.model}; clients connect to tcp://{cfg.host}:{port}{http_note}{tp_note}"


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    setup_logging("launcher", cfg.log_level)
    try:
        check_flags(cfg)
    except ValueError as exc:
        logger.error("%s", exc)
        sys.exit(2)
    cfg = resolve_model(cfg)
    try:
        cfg, layout = resolve_ranks(cfg)
    except (ValueError, FileNotFoundError) as exc:
        logger.error("%s", exc)
        sys.exit(2)
    from common.worker_env import worker_env

    launcher = Launcher(cfg, worker_env(cfg.num_threads, cfg.device, cfg.omp_spin_count), layout)
    signal.signal(signal.SIGTERM, lambda *_: launcher.request_stop())
    signal.signal(signal.SIGINT, lambda *_: launcher.request_stop())
    code = 1
    try:
        port = launcher.start()
        sys.stdout.write(ready_line(cfg, launcher, port) + "\n")  # one write: children share this pipe
        sys.stdout.flush()
        if cfg.shell and layout.is_head_node:
            from client.chat_shell import run_shell

            run_shell(f"tcp://{cfg.host}:{port}", stop_when=lambda: launcher.stop_requested or launcher.first_dead_child())
            code = 0
        else:
            code = launcher.supervise()
    except StartupError as exc:
        logger.error("%s", exc)
    finally:
        launcher.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
