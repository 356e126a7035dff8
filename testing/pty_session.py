"""A command run on a pseudo-terminal, driven as a person at a keyboard would drive it.

    with PtySession.spawn([sys.executable, "-m", "zserve.client", "--zmq-port", "30001"]) as term:
        term.expect("> ")
        term.send("hello\\r")
        term.send_interrupt()          # Ctrl-C: the terminal sends SIGINT to the foreground process

Everything the program prints is kept in `output`. Only the standard library (pty), so the
terminal tests run wherever the suite does.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field


@dataclass
class PtySession:
    proc: subprocess.Popen
    master_fd: int
    output: str = ""
    _raw: bytearray = field(default_factory=bytearray)

    @staticmethod
    def spawn(cmd: list[str], env: dict[str, str] | None = None) -> PtySession:
        master_fd, slave_fd = pty.openpty()
        proc = subprocess.Popen(
            cmd, stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, env=env, close_fds=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave_fd)
        return PtySession(proc, master_fd)

    def __enter__(self) -> PtySession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, text: str) -> None:
        os.write(self.master_fd, text.encode())

    def send_interrupt(self) -> None:
        """Ctrl-C, typed: the terminal's line discipline turns it into SIGINT for the foreground group."""
        self.send("\x03")

    def send_eof(self) -> None:
        self.send("\x04")

    def read_available(self, timeout_s: float = 0.05) -> str:
        while select.select([self.master_fd], [], [], timeout_s)[0]:
            try:
                chunk = os.read(self.master_fd, 65536)
            except OSError:  # EIO: the program exited and closed the terminal
                break
            if not chunk:
                break
            self._raw += chunk
            timeout_s = 0
        self.output = self._raw.decode(errors="replace")
        return self.output

    def expect(self, needle: str, *, after: int = 0, timeout_s: float = 30.0) -> int:
        """Wait until `needle` appears in the output at or after offset `after`; return the offset
        just past it. Raises AssertionError (with the output) on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            at = self.read_available().find(needle, after)
            if at >= 0:
                return at + len(needle)
            if self.proc.poll() is not None:
                self.read_available()
                break
        raise AssertionError(f"{needle!r} did not appear; output so far:\n{self.output}")

    def wait(self, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read_available()
        self.read_available()
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master_fd)


def _take_terminal() -> None:
    """In the child: a new session whose controlling terminal is the pty (stdin), so that
    Ctrl-C typed on it reaches the program as SIGINT."""
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
