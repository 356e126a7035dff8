"""Starts a real `launch_server` (all processes) for integration tests, and stops it."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

READY_RE = re.compile(r"zserve ready: .*clients connect to tcp://([\d.]+):(\d+)")


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    port: int
    log_lines: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(self.log_lines)

    def child_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def child_pid(self, module: str) -> int:
        """The pid of the child started as `python -m <module>`."""
        for pid in self.child_pids():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if module.encode() in argv:
                return pid
        raise AssertionError(f"no child runs {module}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"launch_server did not exit within {timeout_s}s of {signal.Signals(sig).name}\n{self.log()}") from None


def start_server(model_dir: str, *flags: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> ServerHandle:
    cmd = [sys.executable, "-m", "launcher", "--model", str(model_dir), "--port", "0", *flags]
    proc_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=proc_env)
    lines: list[str] = []
    ready: queue.Queue[int] = queue.Queue()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = READY_RE.search(line)
            if m:
                ready.put(int(m.group(2)))

    threading.Thread(target=reader, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            port = ready.get(timeout=0.2)
            return ServerHandle(proc, port, lines)
        except queue.Empty:
            if proc.poll() is not None:
                time.sleep(0.2)
                raise AssertionError(f"launch_server exited with {proc.returncode} before ready:\n{''.join(lines)}") from None
    proc.kill()
    raise AssertionError(f"launch_server not ready within {timeout_s}s:\n{''.join(lines)}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


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
