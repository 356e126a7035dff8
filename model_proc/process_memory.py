"""This process's memory: what it holds (resident set), and handing freed heap pages back.

glibc serves allocations above its mmap threshold with mmap and returns them on free, but the
threshold rises to the largest block freed so far (up to 32 MB), so after the first freed matrix a
model's loading allocates from the heap, whose freed pages stay resident. `release_freed_memory`
(malloc_trim) returns them once loading is done, so the resident size is the model's, not its
load peak's. Elsewhere (no glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
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


def resident_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's resident set (VmRSS), or None where /proc has no such line."""
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None
