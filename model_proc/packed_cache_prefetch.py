"""prefetch_packed_cache: ask the kernel to start reading a model's packed cache (checkpoints/packed_cache.py)
into the page cache, from the worker's first line, before it imports torch.

A cold start (the cache file not in the page cache) then reads it from disk while the worker imports
torch and builds the model (1.5-3 s), instead of after. Torch-free on purpose; `posix_fadvise(WILLNEED)`
returns at once and only starts readahead; nothing is mapped or kept. Which file the runner will
read is decided later (its key); this advises every cache file of this rank's slice (normally one).
"""

from __future__ import annotations

import os
from pathlib import Path


def prefetch_packed_cache(model_dir: str | Path, tp_rank: int, tp_size: int) -> int:
    """Bytes of this rank's packed-cache files whose readahead was asked for (0: none, or no fadvise here)."""
    folder = Path(model_dir) / "packed"
    if not hasattr(os, "posix_fadvise") or not folder.is_dir():
        return 0
    total = 0
    for path in folder.glob(f"tp{tp_rank}of{tp_size}-*.bin"):
        with open(path, "rb") as data:
            os.posix_fadvise(data.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            total += os.fstat(data.fileno()).st_size
    return total
