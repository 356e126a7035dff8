"""A private cache root for a test (GGUF metadata directories it makes land in its tmp_path), whose
kernels/ is the shared build of the CPU kernels, so they are not compiled again (a minute) for it.

    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "cache")))
"""

from __future__ import annotations

from pathlib import Path

from zserve.common.cache_root import KERNELS_SUBDIR, cache_root


def private_cache_dir(path: Path) -> Path:
    """Call before pointing ZSERVE_CACHE_DIR at `path`: the kernels' folder is the current root's."""
    shared = cache_root() / KERNELS_SUBDIR
    shared.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / KERNELS_SUBDIR).symlink_to(shared.resolve(), target_is_directory=True)
    return path
