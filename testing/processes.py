"""Whether processes are alive, and which they are, for tests that kill parts of a server."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until every pid is dead or `timeout_s` passes; returns the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid: int) -> list[bytes]:
    """`pid`'s argv ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except FileNotFoundError:
        return []


@contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """SIGSTOP `pids` for the block and SIGCONT them after it, whatever happened: work in flight
    (a stream on a stopped model process) stays in flight however fast the machine is."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
