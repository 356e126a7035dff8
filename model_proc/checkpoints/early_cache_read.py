"""EarlyCacheRead: this rank's packed-cache file (packed_cache.py) read into anonymous memory on
threads started at the model worker's first line, while it imports torch and builds the model.

    worker start ──> EarlyCacheRead.start(model dir, rank)      threads: preadv into an mmap(-1)
         │ torch import, model build, kernel choice (1-2 s)         (its pages faulted in there)
         └──> PackedCache.open(..., early) ──> early.take(path, bytes) -> the buffer, or None

Torch-free on purpose (it runs before torch is imported). The runner decides which file it reads
(the cache key) only later: `take` hands the buffer over only when it holds that file, whole, read
without error; otherwise it frees it and the cache reads the file itself, as without this. Where the
rank's folder holds no single data file (none yet, or several keys) nothing is started.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20  # parts start on huge-page boundaries (each thread faults in its own pages)


@dataclass
class EarlyCacheRead:
    path: Path
    buffer: mmap.mmap
    errors: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, model_dir: str | Path, tp_rank: int, tp_size: int, num_threads: int = 2) -> EarlyCacheRead | None:
        """Start reading this rank's one packed-cache data file (None: no single such file)."""
        folder = Path(model_dir) / "packed"
        found = sorted(folder.glob(f"tp{tp_rank}of{tp_size}-*.bin")) if folder.is_dir() else []
        if len(found) != 1 or found[0].stat().st_size == 0:
            return None
        path = found[0]
        size = path.stat().st_size
        buffer = mmap.mmap(-1, size)
        if hasattr(mmap, "MADV_HUGEPAGE"):  # as torch's own buffers in the worker (THP_MEM_ALLOC_ENABLE): decode
            buffer.madvise(mmap.MADV_HUGEPAGE)  # streams these weights every step, 4 KiB pages cost it TLB misses
        read = cls(path, buffer)
        bounds = [size * i // num_threads // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES for i in range(num_threads)] + [size]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            thread = threading.Thread(target=read._read_part, args=(lo, hi), name="packed-early-read", daemon=True)
            thread.start()
            read._threads.append(thread)
        return read

    def _read_part(self, lo: int, hi: int) -> None:
        view = memoryview(self.buffer)
        try:
            with open(self.path, "rb") as data:
                done = lo
                while done < hi:
                    got = os.preadv(data.fileno(), [view[done:hi]], done)
                    if got <= 0:
                        raise OSError(f"ended at byte {done} of {hi}")
                    done += got
        except OSError as exc:  # a file cut or replaced meanwhile: the cache reads it itself
            self.errors.append(f"{self.path}: {exc}")
        finally:
            view.release()

    def take(self, path: Path, num_bytes: int) -> mmap.mmap | None:
        """The buffer holding `path`'s `num_bytes` bytes, once read (waits for the threads); None, and
        the buffer freed, when it holds another file, another size, or its read failed."""
        for thread in self._threads:
            thread.join()
        if path == self.path and num_bytes == len(self.buffer) and not self.errors:
            return self.buffer
        if self.errors:
            logger.warning("packed cache: the early read failed (%s); reading it again", "; ".join(self.errors))
        self.buffer.close()
        return None
