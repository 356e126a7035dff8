"""`launch_server` / `python -m launcher`."""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import replace

from common.proc_runtime import setup_logging
from common.server_config import ServerConfig
from launcher.cli import parse_config
from launcher.launcher import Launcher, StartupError

logger = logging.getLogger("launcher")


def resolve_model(cfg: ServerConfig) -> ServerConfig:
    if cfg.model:
        return cfg
    from model_proc.demo_model import ensure_demo_model

    return replace(cfg, model=str(ensure_demo_model(progress=True)))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    setup_logging("launcher", cfg.log_level)
    cfg = resolve_model(cfg)
    from model_proc.worker_env import worker_env

    launcher = Launcher(cfg, worker_env(cfg.num_threads, cfg.device))
    signal.signal(signal.SIGTERM, lambda *_: launcher.request_stop())
    signal.signal(signal.SIGINT, lambda *_: launcher.request_stop())
    code = 1
    try:
        port = launcher.start()
        http = launcher.ready.get("http")
        http_note = f"; HTTP on {http.info['url']}" if http is not None else ""
        print(f"zserve ready: model {cfg.model}; clients connect to tcp://{cfg.host}:{port}{http_note}", flush=True)
        if cfg.shell:
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
