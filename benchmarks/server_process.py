"""A `launch_server` the benchmark starts for one configuration, and stops when the run is done.

    with ServerProcess.start(model_dir, ["--max-prefill-tokens", "64"]) as server:
        ... AsyncClient(server.address) ...

or `spawn` several and `wait_ready` each, so they load at the same time.

Its output is kept (the last lines, for errors) and, when `log_path` is given, written there.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_MARK = "zserve ready:"


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    address: str
    startup_s: float
    tail_lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))

    @staticmethod
    def start(model_dir: str, flags: list[str], *, log_path: Path | None = None, timeout_s: float = 600.0) -> ServerProcess:
        return ServerProcess.spawn(model_dir, flags, log_path=log_path).wait_ready(timeout_s)

    @staticmethod
    def spawn(model_dir: str, flags: list[str], *, log_path: Path | None = None) -> PendingServer:
        """Start launch_server without waiting; several servers can then load at the same time."""
        # The port is picked here, not parsed from the ready line: children log to the same pipe,
        # and a log line can land between the printed port and its newline.
        port = _free_port()
        cmd = [sys.executable, "-m", "launcher", "--model", str(model_dir), *flags, "--port", str(port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        repo_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
        started_s = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        pending = PendingServer(proc, f"tcp://127.0.0.1:{port}", started_s)
        threading.Thread(target=_read_output, args=(proc, pending.tail_lines, pending.ready, log_path), daemon=True).start()
        return pending

    def stop(self, timeout_s: float = 30.0) -> int:
        self.request_stop()
        return self.wait_stopped(timeout_s)

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

    def log_tail(self) -> str:
        return "".join(self.tail_lines)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def resolve_model_dir(model_dir: str) -> str:
    """`model_dir`, or the demo model (fetched on first use) when it is empty."""
    if model_dir:
        return model_dir
    from model_proc.demo_model import ensure_demo_model

    return str(ensure_demo_model(progress=True))


@dataclass
class PendingServer:
    """A launch_server that has been started and may not be ready yet."""

    proc: subprocess.Popen
    address: str
    started_s: float
    tail_lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    ready: queue.Queue[bool] = field(default_factory=queue.Queue)

    def wait_ready(self, timeout_s: float = 600.0) -> ServerProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.ready.get(timeout=0.2)
                return ServerProcess(self.proc, self.address, time.perf_counter() - self.started_s, self.tail_lines)
            except queue.Empty:
                if self.proc.poll() is not None:
                    time.sleep(0.2)  # let the reader take the last lines
                    raise RuntimeError(f"launch_server exited with {self.proc.returncode} before ready:\n{''.join(self.tail_lines)}") from None
        self.kill()
        raise RuntimeError(f"launch_server not ready within {timeout_s:.0f}s:\n{''.join(self.tail_lines)}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_output(proc: subprocess.Popen, tail: collections.deque[str], ready: queue.Queue[bool], log_path: Path | None) -> None:
    assert proc.stdout is not None
    log_file = open(log_path, "a") if log_path is not None else None  # noqa: SIM115 (closed below)
    try:
        for line in proc.stdout:
            tail.append(line)
            if log_file is not None:
                log_file.write(line)
                log_file.flush()
            if READY_MARK in line:
                ready.put(True)
    finally:
        if log_file is not None:
            log_file.close()
