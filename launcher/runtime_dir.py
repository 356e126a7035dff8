"""The launcher's runtime directory (ZMQ ipc sockets, the torch.distributed rendezvous file), and
the sweep of directories left behind by launchers that died (SIGKILL, a power cut).

Each directory is `$TMPDIR/zserve-XXXXXXXX` (mkdtemp: private to this user) with an `owner` file
holding the launcher's pid and its process start time (/proc/PID/stat field 22), so that a pid
reused by an unrelated process does not keep a dead launcher's directory alive. A new launcher
removes every such directory of this user whose owner is gone; directories without an owner
file (being created, or from older versions) are left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger("launcher")
PREFIX = "zserve-"
OWNER_FILE = "owner"


def process_start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; fields after the command name start at 3


def owner_alive(directory: Path) -> bool | None:
    """True/False for a directory with an owner file; None without one (or unreadable)."""
    try:
        pid_text, ticks = (directory / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return None
    return process_start_ticks(int(pid_text)) == ticks


def create_runtime_dir() -> str:
    """A fresh directory owned by this process (after sweeping dead launchers' directories)."""
    sweep_orphans()
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    (path / OWNER_FILE).write_text(f"{os.getpid()} {process_start_ticks(os.getpid())}\n")
    return str(path)


def sweep_orphans(root: str | None = None) -> list[Path]:
    """Remove this user's runtime directories whose launcher is gone; returns what was removed."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for directory in base.glob(f"{PREFIX}*"):
        try:
            mine = directory.is_dir() and not directory.is_symlink() and directory.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and owner_alive(directory) is False:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    if removed:
        logger.info(
            "removed %d runtime director%s of launchers that are gone: %s",
            len(removed), "y" if len(removed) == 1 else "ies", ", ".join(map(str, removed)),
        )
    return removed
