"""`launch_server` / `python -m zserve.launcher`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO

from zserve.common.cpu_isa_level import resolve_cpu_isa
from zserve.common.proc_runtime import setup_logging
from zserve.common.server_config import ServerConfig
from zserve.common.speculative_settings import resolve_speculative_config
from zserve.launcher.cli import parse_config, refuse
from zserve.launcher.config_check import check_flags, check_model, resolve_zmq_port
from zserve.launcher.launcher import Launcher, StartupError
from zserve.launcher.server_ready import ServerReady

logger = logging.getLogger("launcher")


def resolve_model(cfg: ServerConfig) -> ServerConfig:
    """The demo model when --model is empty; a GGUF file becomes a directory of its metadata
    (launcher/gguf_model_dir.py) whose weights stay in the file."""
    if cfg.model:
        from zserve.launcher.gguf_model_dir import gguf_file_of, gguf_model_dir

        gguf_file = gguf_file_of(cfg.model)
        if gguf_file is None:
            return cfg
        model_dir = gguf_model_dir(gguf_file, with_tokenizer=not cfg.tokenizer)
        logger.info("--model %s: metadata in %s, weights read from the GGUF file", gguf_file, model_dir)
        # the API's model name is the file's, not the cache directory's
        return replace(cfg, model=str(model_dir), served_model_name=cfg.served_model_name or gguf_file.name)
    from zserve.launcher.demo_model import ensure_demo_model

    return replace(cfg, model=str(ensure_demo_model(progress=True)))


def open_shell_log(log_level: str) -> IO[str]:
    """Under --shell, every process logs to a file (the path printed once) instead of the terminal."""
    path = Path(tempfile.gettempdir()) / f"zserve-server-{os.getpid()}.log"
    log_file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the server's lifetime
    sys.stdout.write(f"zserve: server logs go to {path}\n")
    sys.stdout.flush()
    setup_logging("launcher", log_level, stream=log_file)
    return log_file


def ready_line(cfg: ServerConfig, launcher: Launcher, port: int | None) -> str:
    layout = launcher.layout
    if not layout.is_head_node:
        ranks = ", ".join(str(r) for r in layout.local_ranks)
        return f"zserve node {layout.node_rank} ready: model ranks {ranks} of {layout.tp_size} joined node 0 at {cfg.dist_init_addr}"
    http = launcher.ready.get("http")
    http_note = f"; HTTP on {http.info['url']}" if http is not None else ""
    tp_note = f"; {layout.tp_size} tensor-parallel ranks on {layout.nnodes} node(s)" if layout.tp_size > 1 else ""
    return f"zserve ready: model {cfg.model}; clients connect to tcp://{cfg.host}:{port}{http_note}{tp_note}"


def ready_record(cfg: ServerConfig, launcher: Launcher, port: int | None, line: str) -> ServerReady:
    http = launcher.ready.get("http")
    return ServerReady(
        pid=os.getpid(), node_rank=launcher.layout.node_rank, model=cfg.model, host=cfg.host, zmq_port=port or 0,
        http_port=int(http.info["port"]) if http is not None else 0, ready_line=line,
    )


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)  # refuses a bad flag alone (exit code 2)
    if cfg.dp_size != 1 or cfg.router:  # data-parallel replicas, each a launch_server like this one (launcher/fleet.py)
        from zserve.launcher.fleet_launch import run_fleet

        setup_logging("fleet", cfg.log_level)
        sys.exit(run_fleet(cfg))
    if os.environ.get("ZSERVE_FLEET_PID"):  # a fleet's replica: it goes when the supervisor does, even SIGKILLed
        from zserve.common.proc_runtime import die_with_parent

        die_with_parent(int(os.environ["ZSERVE_FLEET_PID"]))
    setup_logging("launcher", cfg.log_level)
    if cfg.trust_remote_code:
        logger.info("--trust-remote-code has no effect: zserve runs its own model code, never code from the model directory")
    try:
        cfg = resolve_speculative_config(cfg)  # vLLM's --speculative-config JSON into the --speculative-* flags
        layout = check_flags(cfg)
        cfg = check_model(resolve_model(resolve_zmq_port(cfg) if layout.is_head_node else cfg), layout)
        cfg = replace(cfg, cpu_isa=resolve_cpu_isa(cfg.cpu_isa))  # once: auto is this CPU's level; one it lacks is refused
    except ValueError as exc:
        refuse(str(exc))
    from zserve.common.worker_env import worker_env

    shell = cfg.shell and layout.is_head_node
    log_file = open_shell_log(cfg.log_level) if shell else None  # the chat gets the terminal to itself
    launcher = Launcher(cfg, worker_env(cfg.num_threads, cfg.device, cfg.omp_spin_count, cfg.cpu_isa), layout, log_file)
    signal.signal(signal.SIGTERM, launcher.on_stop_signal)
    # Ctrl-C: drain, a second one aborts; under --shell it is the chat's (it stops an answer)
    signal.signal(signal.SIGINT, signal.default_int_handler if shell else launcher.on_stop_signal)
    code = 1
    try:
        port = launcher.start()
        line = ready_line(cfg, launcher, port)
        sys.stdout.write(line + "\n")  # one write: children share this pipe
        sys.stdout.flush()
        if cfg.ready_file:  # after the line: a program that waits for the record finds the line in the log already sent
            ready_record(cfg, launcher, port, line).write(cfg.ready_file)
        if shell:
            from zserve.client.chat_shell import run_shell

            run_shell(
                f"tcp://{cfg.host}:{port}", stop_when=lambda: launcher.stop_requested or launcher.first_dead_child(),
                api_key=cfg.api_key or None,  # None: $ZSERVE_API_KEY, as the launcher reads it
            )
            code = 0
        else:
            code = launcher.supervise()
        if code == 0:
            code = launcher.drain()
    except StartupError as exc:
        logger.error("%s", exc)
    finally:
        launcher.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
