"""Starts, supervises and stops the processes of one node of the server.

    start:     runtime dir -> this node's model worker ranks, then on node 0 the scheduler,
               detokenizer, tokenizer -> wait for each ProcReady
               (and with --http-port, the HTTP process once the tokenizer's client port is known)
    supervise: until SIGINT/SIGTERM or a child dies
    drain:     on a signal: the frontend refuses new requests, in-flight ones finish (up to
               --drain-timeout-s; a second signal cuts it short)
    shutdown:  in-flight requests end (abort, or error naming the dead children) -> SIGTERM children
               -> SIGKILL stragglers -> remove the runtime dir

Node 0 is the server; a node other than 0 (`--node-rank` > 0) runs only its model worker ranks,
which join node 0's at `--dist-init-addr`. Such a node stops when its ranks exit: cleanly
(code 0) when node 0 stopped and told them so, with an error when a rank failed or node 0
went silent. Children also die on their own if the launcher is SIGKILLed (common/proc_runtime.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import replace
from typing import IO

import zmq

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import FRONTEND_INBOX, LAUNCHER_INBOX, Drain, DrainDone, FailAll, ProcReady
from zserve.common.model_facts import ModelFacts
from zserve.common.rank_layout import RankLayout
from zserve.common.server_config import API_KEY_ENV, ServerConfig
from zserve.common.start_phases import StartPhases
from zserve.common.transport import Addresses, pull, push
from zserve.launcher.child_process import ChildProcess
from zserve.launcher.runtime_dir import create_runtime_dir
from zserve.launcher.start_timeline import StartTimeline

logger = logging.getLogger("launcher")
SERVER_CHILDREN = (  # (name, module) started on node 0 after the model worker ranks (they load longest)
    ("scheduler", "zserve.scheduler_proc"),
    ("detokenizer", "zserve.detokenizer_proc"),
    ("tokenizer", "zserve.tokenizer_proc"),
)


class StartupError(RuntimeError):
    pass


class Launcher:
    def __init__(
        self, cfg: ServerConfig, model_facts: ModelFacts, worker_env: dict[str, str], layout: RankLayout | None = None,
        log_file: IO[str] | None = None, timeline: StartTimeline | None = None,
    ):
        """`cfg` and `model_facts` as launcher/config_resolver.py resolved them (every child gets both);
        `log_file`: where the children's output goes (default: the launcher's stdout and stderr);
        `timeline`: where the start's time went, logged once every child is ready (default: from now)."""
        self.cfg = cfg
        self.timeline = timeline or StartTimeline.from_launcher_phases(StartPhases())
        self.model_facts = model_facts
        self.log_file = log_file
        self.layout = layout or RankLayout.from_config(cfg)
        self.worker_env = {**worker_env, **self.layout.rank_env()}
        self.runtime_dir = create_runtime_dir()  # removes the directories of launchers that died
        self.addrs = Addresses.in_dir(
            self.runtime_dir,
            f"tcp://{cfg.host}:{cfg.zmq_port}",
            rank_broadcast=self.layout.broadcast_address(self.runtime_dir),
            dist_init=self.layout.dist_init_method(self.runtime_dir),
        )
        self.ctx = zmq.Context()
        self.inbox = pull(self.ctx, self.addrs.launcher_inbox, LAUNCHER_INBOX)
        self.to_frontend = (
            push(self.ctx, self.addrs.frontend_inbox, FRONTEND_INBOX) if self.layout.is_head_node else None
        )
        self.children: list[ChildProcess] = []
        self.ready: dict[str, ProcReady] = {}
        self.stop_requested = False
        self.abort_requested = False  # a second stop signal: skip (or cut short) the drain

    def start(self) -> int | None:
        """Start every child of this node and wait until all are ready; returns the client port
        (None on a node other than 0)."""
        # the API key goes to the frontend (tokenizer) and the HTTP process (a client of the frontend) in
        # their environment, never on a command line (ps shows those)
        args = ["--config", replace(self.cfg, api_key="").to_json(), "--addresses", self.addrs.to_json(),
                "--model-facts", self.model_facts.to_json()]
        api_key = self.cfg.api_key or os.environ.get(API_KEY_ENV, "")
        key_env = {API_KEY_ENV: api_key} if api_key else None
        for rank in self.layout.local_ranks:
            name = self.layout.child_name(rank)
            rank_args = [*args, "--rank", str(rank)]
            self.children.append(
                ChildProcess.start(name, "zserve.model_proc", rank_args, self.worker_env, self.log_file)
            )
            self.timeline.spawned(name)
        if self.layout.is_head_node:
            for name, module in SERVER_CHILDREN:
                env = key_env if module == "zserve.tokenizer_proc" else None
                self.children.append(ChildProcess.start(name, module, args, env, self.log_file))
                self.timeline.spawned(name)
            # the client port is known: HTTP answers /health (503) during startup
            if self.cfg.http_port and self.cfg.zmq_port:
                self._start_http(args, self.cfg.zmq_port, key_env)
        expected = {c.name for c in self.children} | (
            {"http"} if self.layout.is_head_node and self.cfg.http_port else set()
        )
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
                self.timeline.ready(msg)
                logger.info("%s ready (pid %d)", msg.name, msg.pid)
                # HTTP needs the picked port
                if msg.name == "tokenizer" and self.cfg.http_port and not self.cfg.zmq_port:
                    self._start_http(args, int(msg.info["port"]), key_env)
        logger.info("%s", self.timeline.summary())
        return int(self.ready["tokenizer"].info["port"]) if self.layout.is_head_node else None

    def _start_http(self, args: list[str], client_port: int, key_env: dict[str, str] | None) -> None:
        http_args = [*args, "--client-port", str(client_port)]
        self.children.append(ChildProcess.start("http", "zserve.http_proc", http_args, key_env, self.log_file))
        self.timeline.spawned("http")

    def supervise(self) -> int:
        """Block until a stop signal (returns 0) or a dead child (returns 1; 0 on a node other
        than 0 whose ranks exited cleanly because node 0 stopped)."""
        while not self.stop_requested:
            dead = self.dead_children()
            if dead:
                return self._on_dead_children(dead)
            time.sleep(0.1)
        logger.info("stop requested; shutting down")
        return 0

    def _on_dead_children(self, dead: list[tuple[str, int]]) -> int:
        if not self.layout.is_head_node and all(code == 0 for _, code in dead):
            logger.info("node 0 stopped the server; stopping node %d", self.layout.node_rank)
            return 0
        what = "; ".join(f"the {name} process {ChildProcess.describe_exit(code)}" for name, code in dead)
        logger.error(
            "%s; shutting %s down", what, "the server" if self.to_frontend else f"node {self.layout.node_rank}"
        )
        if self.to_frontend is not None:
            self.to_frontend.send(
                FailAll(finish_reason=FinishReason.ERROR, code=ErrorCode.GONE, error=f"server failure: {what}")
            )
        return 1

    def dead_children(self) -> list[tuple[str, int]]:
        """(name, exit code) of every child that has exited."""
        return [(c.name, c.popen.returncode) for c in self.children if c.popen.poll() is not None]

    def first_dead_child(self) -> tuple[str, str] | None:
        for child in self.children:
            how = child.exit_description()
            if how is not None:
                return child.name, how
        return None

    def request_stop(self) -> None:
        self.stop_requested = True

    def on_stop_signal(self, signum: int, _frame=None) -> None:
        """SIGTERM or Ctrl-C: the first stops the server after a drain, a second aborts at once."""
        if self.stop_requested:
            self.abort_requested = True
        self.stop_requested = True

    def drain(self) -> int:
        """Let in-flight requests finish (new ones are refused) for up to --drain-timeout-s, unless
        the timeout is 0 or a second signal comes. Returns the exit code: 1 when a process died
        (before or during the drain: clients get the error naming it), else 0."""
        if not self.layout.is_head_node:
            return 0  # no frontend here: node 0 drains
        dead = self.dead_children()
        if dead:
            return self._on_dead_children(dead)
        timeout_s = self.cfg.drain_timeout_s
        if timeout_s <= 0 or self.to_frontend is None or "tokenizer" not in self.ready:
            return 0
        self.to_frontend.send(Drain(timeout_s=timeout_s))
        logger.info("draining in-flight requests (up to %gs; Ctrl-C again to abort them)", timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.abort_requested:
                logger.info("second stop signal: aborting the requests still in flight")
                return 0
            dead = self.dead_children()
            if dead:
                return self._on_dead_children(dead)
            msg = self.inbox.recv(timeout_ms=100)
            if isinstance(msg, DrainDone):
                logger.info("drained: %d request(s) finished", msg.num_drained)
                return 0
        logger.info("drain timeout (%gs): aborting the requests still in flight", timeout_s)
        return 0

    def shutdown(self) -> None:
        if self.ready.get("tokenizer") and self.first_dead_child() is None:
            self.to_frontend.send(FailAll(finish_reason=FinishReason.ABORT))
            time.sleep(0.3)  # let the frontend tell its clients before it goes
        elif self.ready.get("tokenizer"):
            time.sleep(0.3)  # FailAll(ERROR, GONE) was sent by supervise()
        for child in self.children:
            child.terminate()
        for child in self.children:
            child.wait_or_kill(timeout_s=5.0)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        logger.info("all processes stopped")
