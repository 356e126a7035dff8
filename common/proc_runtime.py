"""What every child process does first: logging, dying with its parent, and clean SIGTERM.

No orphans, ever: on Linux the kernel sends SIGKILL to a child when the launcher dies
(PR_SET_PDEATHSIG), and a watchdog thread checks the parent pid as a fallback elsewhere.
SIGTERM raises `SystemExit` in the main thread so `finally` blocks close sockets. SIGINT is
ignored: a Ctrl-C in the launcher's terminal reaches the whole process group, and the launcher
alone decides what it means (drain first, abort on a second one), then stops its children.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


LOG_LEVELS = ("debug", "info", "warning", "error")  # --log-level


def setup_logging(name: str, level: str, stream=None) -> None:
    """Log lines to `stream` (default stderr), each naming the process."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"%(asctime)s.%(msecs)03d {name:<9} %(levelname)-5s %(message)s",
        datefmt="%H:%M:%S",
        stream=stream or sys.stderr,
        force=True,
    )


def die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # parent already gone before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_on_sigterm() -> None:
    def handler(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def child_setup(name: str, log_level: str) -> None:
    setup_logging(name, log_level)
    die_with_parent(int(os.environ.get("ZSERVE_PARENT_PID", os.getppid())))
    exit_on_sigterm()


def child_args(argv: list[str] | None = None):
    """(ServerConfig, Addresses, extra) from a child's command line: --config JSON --addresses JSON
    --model-facts JSON [--rank N]; extra.model_facts is the launcher's ModelFacts."""
    import argparse

    from zserve.common.model_facts import ModelFacts
    from zserve.common.server_config import ServerConfig
    from zserve.common.transport import Addresses

    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--addresses", required=True)
    parser.add_argument("--model-facts", required=True, type=ModelFacts.from_json)
    parser.add_argument("--rank", type=int, default=0)
    ns = parser.parse_args(argv)
    return ServerConfig.from_json(ns.config), Addresses.from_json(ns.addresses), ns
