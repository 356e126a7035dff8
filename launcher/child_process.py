"""One supervised child process of the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import IO


@dataclass
class ChildProcess:
    name: str
    popen: subprocess.Popen

    @staticmethod
    def start(
        name: str, module: str, args: list[str], env: dict[str, str] | None = None, log_file: IO[str] | None = None,
    ) -> ChildProcess:
        """`log_file`: where its output goes (default: the launcher's own stdout and stderr)."""
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env["ZSERVE_PARENT_PID"] = str(os.getpid())
        popen = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=child_env, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # a terminal's Ctrl-C reaches only the launcher, even while a child still imports
        )
        return ChildProcess(name, popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_description(self) -> str | None:
        """None while running; else how it ended."""
        code = self.popen.poll()
        return None if code is None else ChildProcess.describe_exit(code)

    @staticmethod
    def describe_exit(code: int) -> str:
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()

    def wait_or_kill(self, timeout_s: float) -> None:
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
