"""`launch_server` / `python -m zserve.launcher`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import IO

from zserve.common.proc_runtime import setup_logging
from zserve.common.rank_layout import RankLayout
from zserve.common.server_config import ServerConfig
from zserve.common.start_phases import StartPhases
from zserve.launcher.cli import parse_config, refuse
from zserve.launcher.config_resolver import resolve_config
from zserve.launcher.launcher import Launcher, StartupError
from zserve.launcher.server_ready import ServerReady
from zserve.launcher.start_timeline import StartTimeline

logger = logging.getLogger("launcher")


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
        return (
            f"zserve node {layout.node_rank} ready: model ranks {ranks} of {layout.tp_size} joined node 0 at "
            f"{cfg.dist_init_addr}"
        )
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
    phases = StartPhases.since_process_start()
    cfg = parse_config(argv)  # refuses a bad flag alone (exit code 2)
    # data-parallel replicas, each a launch_server like this one (launcher/fleet/supervisor.py)
    if cfg.dp_size != 1 or cfg.router:
        from zserve.launcher.fleet.run import run_fleet

        setup_logging("fleet", cfg.log_level)
        sys.exit(run_fleet(cfg))
    if os.environ.get("ZSERVE_FLEET_PID"):  # a fleet's replica: it goes when the supervisor does, even SIGKILLed
        from zserve.common.proc_runtime import die_with_parent

        die_with_parent(int(os.environ["ZSERVE_FLEET_PID"]))
    setup_logging("launcher", cfg.log_level)
    if cfg.trust_remote_code:
        logger.info(
            "--trust-remote-code has no effect: zserve runs its own model code, never code from the model directory"
        )
    try:
        cfg, model_facts = resolve_config(cfg, phases)
    except ValueError as exc:
        refuse(str(exc))
    from zserve.common.worker_env import worker_env

    layout = RankLayout.from_config(cfg)
    shell = cfg.shell and layout.is_head_node
    log_file = open_shell_log(cfg.log_level) if shell else None  # the chat gets the terminal to itself
    launcher = Launcher(
        cfg, model_facts, worker_env(cfg.num_threads, cfg.device, cfg.omp_spin_count, cfg.cpu_isa), layout, log_file,
        StartTimeline.from_launcher_phases(phases),
    )
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
