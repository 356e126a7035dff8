"""Runtime directories: each names its launcher (pid + start time), and a new launcher removes
those whose launcher is gone, and only those."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from zserve.launcher.runtime_dir import (
    OWNER_FILE,
    PREFIX,
    create_runtime_dir,
    owner_alive,
    process_start_ticks,
    sweep_orphans,
)


def make_dir(root, name: str, owner: str | None):
    path = root / name
    path.mkdir()
    (path / "sock").write_text("")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def dead_pid_and_ticks() -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    ticks = process_start_ticks(proc.pid)
    proc.wait()
    assert ticks is not None and process_start_ticks(proc.pid) is None
    return proc.pid, ticks


def test_sweep_removes_only_dead_launchers_directories(tmp_path):
    pid, ticks = dead_pid_and_ticks()
    me = f"{os.getpid()} {process_start_ticks(os.getpid())}"
    dead = make_dir(tmp_path, f"{PREFIX}dead", f"{pid} {ticks}")
    reused = make_dir(tmp_path, f"{PREFIX}reused", f"{os.getpid()} 1")  # our pid, another start time: a reused pid
    alive = make_dir(tmp_path, f"{PREFIX}alive", me)
    ownerless = make_dir(tmp_path, f"{PREFIX}old", None)
    garbled = make_dir(tmp_path, f"{PREFIX}garbled", "not a pid")
    other = make_dir(tmp_path, "other-dead", f"{pid} {ticks}")
    assert owner_alive(dead) is False and owner_alive(alive) is True and owner_alive(ownerless) is None
    assert sorted(sweep_orphans(str(tmp_path))) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert alive.exists() and ownerless.exists() and garbled.exists() and other.exists()
    assert sweep_orphans(str(tmp_path)) == []


def test_create_names_its_owner():
    path = create_runtime_dir()
    try:
        assert os.path.basename(path).startswith(PREFIX) and (os.stat(path).st_mode & 0o777) == 0o700
        assert owner_alive(Path(path)) is True
    finally:
        shutil.rmtree(path)
