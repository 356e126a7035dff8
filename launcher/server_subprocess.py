"""ServerSubprocess: `launch_server` started as a child of this process, ready when it says so.

    server = ServerSubprocess.start(["--model", path, "--port", "0"])
    ready = server.wait_ready(timeout_s=600)        # a ServerReady: ports, the launcher's pid
    ... Client(ready.address) ...
    server.stop()

Readiness is the launcher's typed record (`--ready-file`, launcher/server_ready.py), never a
log line scraped for ports; the log (stdout and stderr together) is kept in `log_lines`, copied
to stderr (`echo_logs`) and to a file (`log_path`) as it comes. Used by zserve.Engine and by the
tests' and benchmarks' testing/server_process.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from zserve.launcher.server_ready import ServerReady

POLL_S = 0.05
LOG_CATCH_UP_S = 2.0  # after the record: how long the log reader may take to file the ready line printed before it


class ServerStartError(RuntimeError):
    """launch_server exited, or was not ready in time, before its ready record came (the message
    ends with its last log lines)."""


@dataclass
class ServerSubprocess:
    proc: subprocess.Popen
    ready_path: Path
    started_s: float  # time.perf_counter() at start
    log_lines: list[str] = field(default_factory=list)
    max_log_lines: int | None = None  # keep only the newest this many (None: all)
    ready: ServerReady | None = None
    echo_prefix: str = ""  # put before each echoed line (a fleet's "replica 1 | ")

    @staticmethod
    def start(
        argv: list[str], *, env: dict[str, str] | None = None, echo_logs: bool = False, log_path: Path | None = None,
        max_log_lines: int | None = None, echo_prefix: str = "", new_session: bool = False,
    ) -> ServerSubprocess:
        """Start `launch_server ARGV` (with `--ready-file` added) without waiting. `env`: the whole
        environment (default: this process's), with PYTHONUNBUFFERED=1 so log lines come as written."""
        ready_path = Path(tempfile.gettempdir()) / f"zserve-ready-{os.getpid()}-{uuid.uuid4().hex}.json"
        cmd = [sys.executable, "-m", "zserve.launcher", *argv, "--ready-file", str(ready_path)]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            env=dict(os.environ if env is None else env, PYTHONUNBUFFERED="1"),
            start_new_session=new_session,  # a fleet's replicas: a terminal's Ctrl-C reaches the supervisor alone
        )
        server = ServerSubprocess(
            proc, ready_path, time.perf_counter(), max_log_lines=max_log_lines, echo_prefix=echo_prefix,
        )
        threading.Thread(
            target=server._read_logs, args=(echo_logs, log_path), name="zserve-server-logs", daemon=True,
        ).start()
        return server

    def wait_ready(self, timeout_s: float) -> ServerReady:
        """The ready record, once every process of the server is ready. ServerStartError if the
        launcher exits first, or after `timeout_s` (the launcher is then killed)."""
        deadline = time.monotonic() + timeout_s
        while self.ready is None:
            self.ready = ServerReady.read(self.ready_path)
            if self.ready is not None:
                break
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the log reader take the last lines
                raise ServerStartError(
                    f"launch_server exited with code {self.proc.returncode} before it was ready:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(f"launch_server not ready within {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(POLL_S)
        self.ready_path.unlink(missing_ok=True)
        self._wait_for_line(self.ready.ready_line, LOG_CATCH_UP_S)
        return self.ready

    @property
    def startup_s(self) -> float:
        return time.perf_counter() - self.started_s

    def log(self) -> str:
        return "".join(self.log_lines)

    def log_tail(self, num_lines: int = 200) -> str:
        return "".join(self.log_lines[-num_lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0, *, drain: bool = True) -> int:
        """Signal the launcher and wait for it; returns its exit code. `drain=False` sends the
        signal twice: the second skips the drain (nobody waits for those answers). Raises
        subprocess.TimeoutExpired, the launcher left running, when it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if not drain:
                self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.ready_path.unlink(missing_ok=True)

    def kill(self) -> int:
        """SIGKILL (its children die with it: PR_SET_PDEATHSIG) and wait."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.ready_path.unlink(missing_ok=True)
        return self.proc.wait()

    def _wait_for_line(self, line: str, timeout_s: float) -> None:
        """The launcher printed `line` before it wrote the record: give the log reader a moment to
        file it, so a caller reading the log after wait_ready finds it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(seen.rstrip("\n") == line for seen in reversed(self.log_lines)):
            time.sleep(0.01)

    def _read_logs(self, echo: bool, log_path: Path | None) -> None:
        assert self.proc.stdout is not None
        log_file = open(log_path, "a") if log_path is not None else None  # noqa: SIM115 (closed below)
        try:
            for line in self.proc.stdout:
                self.log_lines.append(line)
                if self.max_log_lines is not None and len(self.log_lines) > 2 * self.max_log_lines:
                    del self.log_lines[: -self.max_log_lines]  # amortized: the list never holds more than twice the cap
                if echo:
                    sys.stderr.write(self.echo_prefix + line)
                if log_file is not None:
                    log_file.write(line)
                    log_file.flush()
        finally:
            if log_file is not None:
                log_file.close()
