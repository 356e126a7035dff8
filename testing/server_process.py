"""A real `launch_server` (every process) started for a test or a benchmark, and stopped.

    server = start_server(model_dir, "--page-size", "4")          # tests: flags as arguments
    with ServerProcess.start(model_dir, ["--chunked-prefill-size", "64"]) as server:   # benchmarks
        ... Client(server.port) / AsyncClient(server.address) ...

or `spawn` several and `wait_ready` each, so they load at the same time. Starting and readiness
are launcher/server_subprocess.py's (the launcher's typed ready record, not its log); everything
the server prints is kept (`log()`) and, when `log_path` is given, written there as it comes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from testing.paths import REPO_ROOT
from testing.processes import child_pids, cmdline
from zserve.common.net_ports import free_port  # tests and benchmarks take it from here too
from zserve.launcher.server_ready import ServerReady
from zserve.launcher.server_subprocess import ServerSubprocess


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    startup_s: float = 0.0
    log_lines: list[str] = field(default_factory=list)
    http_port: int = 0  # the HTTP port, from the ready record (0: none; tests that start their own set it)
    ready: ServerReady | None = None  # None for a server not started through ServerSubprocess

    @staticmethod
    def start(
        model_dir: str | Path, flags: list[str], *, log_path: Path | None = None, timeout_s: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        return ServerProcess.spawn(model_dir, flags, log_path=log_path, env=env).wait_ready(timeout_s)

    @staticmethod
    def spawn(
        model_dir: str | Path, flags: list[str], *, log_path: Path | None = None, env: dict[str, str] | None = None
    ) -> PendingServer:
        """Start launch_server without waiting; several servers can then load at the same time."""
        no_http = [] if {"--port", "--http-port"} & set(flags) else ["--port", "0"]  # the default HTTP port is one per machine
        return ServerProcess.spawn_argv(
            ["--model", str(model_dir), *no_http, *flags, "--zmq-port", str(free_port())], log_path=log_path, env=env,
        )

    @staticmethod
    def spawn_with_defaults(flags: list[str], *, env: dict[str, str] | None = None) -> PendingServer:
        """`launch_server FLAGS` as a user types it: the default model and ports unless `flags` say."""
        return ServerProcess.spawn_argv(flags, env=env)

    @staticmethod
    def spawn_argv(argv: list[str], *, log_path: Path | None = None, env: dict[str, str] | None = None) -> PendingServer:
        """`launch_server ARGV`, exactly (no port or model added), without waiting."""
        proc_env = dict(os.environ, **(env or {}))
        proc_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), proc_env.get("PYTHONPATH")) if p)
        return PendingServer(ServerSubprocess.start(argv, env=proc_env, log_path=log_path))

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(self.log_lines)

    def log_tail(self, num_lines: int = 200) -> str:
        return "".join(self.log_lines[-num_lines:])

    def wait_logged(self, needle: str, timeout_s: float = 30.0) -> None:
        """Until the log holds `needle` (AssertionError with the log's tail after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not logged within {timeout_s}s\n{self.log_tail()}")
            time.sleep(0.005)

    def child_pids(self) -> list[int]:
        return child_pids(self.proc.pid)

    def child_pid(self, module: str) -> int:
        """The pid of the child started as `python -m <module>`."""
        want = (module if module.startswith("zserve.") else f"zserve.{module}").encode()
        for pid in self.child_pids():
            if want in cmdline(pid):
                return pid
        raise AssertionError(f"no child runs {module}")

    def rank_pid(self, rank: int) -> int:
        """The pid of the child running model worker rank `rank`."""
        for pid in self.child_pids():
            argv = cmdline(pid)
            if b"zserve.model_proc" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode():
                return pid
        raise AssertionError(f"no child runs rank {rank}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Signal the launcher and wait for it; one that does not exit in time is killed and reported."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"launch_server did not exit within {timeout_s}s of {signal.Signals(sig).name}\n{self.log_tail()}"
            ) from None

    def request_stop(self) -> None:
        """SIGTERM, without waiting (stop several servers at once, then `wait_stopped` each)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class PendingServer:
    """A launch_server that has been started and may not be ready yet."""

    server: ServerSubprocess

    @property
    def proc(self) -> subprocess.Popen:
        return self.server.proc

    @property
    def log_lines(self) -> list[str]:
        return self.server.log_lines

    def wait_ready(self, timeout_s: float = 600.0) -> ServerProcess:
        """The ServerProcess once it is ready; RuntimeError (ServerStartError) naming why not, with its log."""
        ready = self.server.wait_ready(timeout_s)
        return ServerProcess(
            self.server.proc, ready.zmq_port, self.server.startup_s, self.server.log_lines, ready.http_port, ready,
        )

    def kill(self) -> None:
        self.server.kill()


def start_server(model_dir: str | Path, *flags: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> ServerProcess:
    """A ready server with `flags` (the tests' spelling of `ServerProcess.start`)."""
    return ServerProcess.start(model_dir, list(flags), timeout_s=timeout_s, env=env)


def wait_idle(client, timeout_s: float = 15.0) -> dict:
    """Poll the server's stats through `client` until nothing runs, waits or prefills; returns them."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = client.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["num_prefilling"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle: {stats}")
        time.sleep(0.05)


def resolve_model_dir(model_dir: str) -> str:
    """`model_dir`, or the demo model (fetched on first use) when it is empty."""
    if model_dir:
        return model_dir
    from zserve.launcher.demo_model import ensure_demo_model

    return str(ensure_demo_model(progress=True))
