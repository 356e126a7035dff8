"""This process's memory: what it holds (resident set), and handing freed heap pages back.

glibc serves allocations above its mmap threshold with mmap and returns them on free, but the
threshold rises to the largest block freed so far (up to 32 MB), so after the first freed matrix a
model's loading allocates from the heap, whose freed pages stay resident. `release_freed_memory`
(malloc_trim) returns them once loading is done, so the resident size is the model's, not its
load peak's. Elsewhere (no glibc) it does nothing.

The worker keeps freed heap memory on purpose while it serves (worker_env.py: the next step reuses
the pages without faulting them in again), so a large step's activations (a long prefill chunk)
would stay resident for good. `IdleHeapRelease` returns them once the worker has had no batch for
`idle_s` after a step: busy, steps reuse the heap; at rest, the process holds what the model holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import time
from pathlib import Path

logger = logging.getLogger(__name__)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); whether it could."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


class IdleHeapRelease:
    """When a worker's freed heap pages go back to the system: once per busy spell, after `idle_s` without a step."""

    def __init__(self, idle_s: float, release=release_freed_memory, clock=time.monotonic):
        if idle_s <= 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s}")
        self.idle_s = idle_s
        self._release, self._clock = release, clock
        self._last_step_s: float | None = None  # None: nothing ran since the last release

    def step_done(self) -> None:
        self._last_step_s = self._clock()

    def wait_ms(self) -> int | None:
        """How long the worker may wait for its next batch before `on_idle` is due (None: no release pending)."""
        if self._last_step_s is None:
            return None
        return max(0, math.ceil((self._last_step_s + self.idle_s - self._clock()) * 1000))  # never wakes early

    def on_idle(self) -> bool:
        """Called when a wait for a batch timed out: releases when due; whether it did."""
        if self._last_step_s is None or self._clock() - self._last_step_s < self.idle_s:
            return False
        self._last_step_s = None
        self._release()
        return True


def resident_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's resident set (VmRSS), or None where /proc has no such line."""
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None
