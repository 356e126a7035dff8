"""Starts, supervises and stops the server's processes.

    start:     runtime dir -> model worker, scheduler, detokenizer, tokenizer -> wait for each ProcReady
               (and with --http-port, the HTTP process once the tokenizer's client port is known)
    supervise: until SIGINT/SIGTERM or a child dies
    shutdown:  in-flight requests end (abort, or error naming the dead child) -> SIGTERM children
               -> SIGKILL stragglers -> remove the runtime dir

Children also die on their own if the launcher is SIGKILLed (common/proc_runtime.py).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time

import zmq

from common.messages import FRONTEND_INBOX, LAUNCHER_INBOX, FailAll, ProcReady
from common.server_config import ServerConfig
from common.transport import Addresses, pull, push
from launcher.child_process import ChildProcess

logger = logging.getLogger("launcher")
CHILDREN = (  # (name, module); the model worker first: it takes longest to load
    ("model", "model_proc"),
    ("scheduler", "scheduler_proc"),
    ("detokenizer", "detokenizer_proc"),
    ("tokenizer", "tokenizer_proc"),
)


class StartupError(RuntimeError):
    pass


class Launcher:
    def __init__(self, cfg: ServerConfig, worker_env: dict[str, str]):
        self.cfg = cfg
        self.worker_env = worker_env
        self.runtime_dir = tempfile.mkdtemp(prefix="zserve-")
        self.addrs = Addresses.in_dir(self.runtime_dir, f"tcp://{cfg.host}:{cfg.port}")
        self.ctx = zmq.Context()
        self.inbox = pull(self.ctx, self.addrs.launcher_inbox, LAUNCHER_INBOX)
        self.to_frontend = push(self.ctx, self.addrs.frontend_inbox, FRONTEND_INBOX)
        self.children: list[ChildProcess] = []
        self.ready: dict[str, ProcReady] = {}
        self.stop_requested = False

    def start(self) -> int:
        """Start every child and wait until all are ready; returns the client port."""
        args = ["--config", self.cfg.to_json(), "--addresses", self.addrs.to_json()]
        for name, module in CHILDREN:
            env = self.worker_env if name == "model" else {}
            self.children.append(ChildProcess.start(name, module, args, env))
        expected = {n for n, _ in CHILDREN} | ({"http"} if self.cfg.http_port else set())
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while len(self.ready) < len(expected):
            if self.stop_requested:
                raise StartupError("stopped by a signal during startup")
            dead = self.first_dead_child()
            if dead is not None:
                raise StartupError(f"{dead[0]} process failed to start: {dead[1]} (its log is above)")
            if time.monotonic() > deadline:
                missing = sorted(expected - set(self.ready))
                raise StartupError(f"not ready after {self.cfg.startup_timeout_s:.0f}s: {', '.join(missing)}")
            msg = self.inbox.recv(timeout_ms=200)
            if isinstance(msg, ProcReady):
                self.ready[msg.name] = msg
                logger.info("%s ready (pid %d)", msg.name, msg.pid)
                if msg.name == "tokenizer" and self.cfg.http_port:  # the HTTP process needs the client port
                    http_args = [*args, "--client-port", str(msg.info["port"])]
                    self.children.append(ChildProcess.start("http", "http_proc", http_args))
        return int(self.ready["tokenizer"].info["port"])

    def supervise(self) -> int:
        """Block until a stop signal (returns 0) or a dead child (returns 1)."""
        while not self.stop_requested:
            dead = self.first_dead_child()
            if dead is not None:
                name, how = dead
                logger.error("%s process %s; shutting the server down", name, how)
                self.to_frontend.send(FailAll("error", f"server failure: the {name} process {how}"))
                return 1
            time.sleep(0.1)
        logger.info("stop requested; shutting down")
        return 0

    def first_dead_child(self) -> tuple[str, str] | None:
        for child in self.children:
            how = child.exit_description()
            if how is not None:
                return child.name, how
        return None

    def request_stop(self) -> None:
        self.stop_requested = True

    def shutdown(self) -> None:
        if self.ready.get("tokenizer") and self.first_dead_child() is None:
            self.to_frontend.send(FailAll("abort", None))
            time.sleep(0.3)  # let the frontend tell its clients before it goes
        elif self.ready.get("tokenizer"):
            time.sleep(0.3)  # FailAll("error") was sent by supervise()
        for child in self.children:
            child.terminate()
        for child in self.children:
            child.wait_or_kill(timeout_s=5.0)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        logger.info("all processes stopped")
