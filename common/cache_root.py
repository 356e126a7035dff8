"""Where zserve keeps what it builds once per machine: one root for the model cache and the kernels.

    $ZSERVE_CACHE_DIR, else $XDG_CACHE_HOME/zserve, else ~/.cache/zserve
      SmolLM2-135M-Instruct/   the demo model (launcher/demo_model.py)
      gguf/<name>-<key>/       a GGUF file's metadata directory (launcher/gguf_model_dir.py)
      kernels/                 the CPU kernels' builds (model_proc/kernels/cpu_kernels.py)

The rule lives here, not in the launcher, because the model worker (which never imports the
launcher) builds the kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "ZSERVE_CACHE_DIR"
KERNELS_SUBDIR = "kernels"


def cache_root() -> Path:
    """The cache root as the environment says now (read on every call: tests and users move it)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "zserve"
