"""The kernel build's cache folder: keyed by the install that compiles it, and never stuck on a
lock file left by a build that was killed."""

from __future__ import annotations

import multiprocessing
import sys

from zserve.model_proc.kernels import cpu_kernels
from zserve.model_proc.kernels.cpu_isa import IsaFeatures


def test_a_lock_file_left_by_a_killed_build_is_removed(tmp_path):
    build_dir = tmp_path / "cpu_kernels-avx2-0123"
    build_dir.mkdir()
    (build_dir / "lock").write_text("")  # torch's FileBaton waits on this forever
    with cpu_kernels._build_lock(build_dir):
        assert not (build_dir / "lock").exists()
    assert (tmp_path / "cpu_kernels-avx2-0123.flock").exists()


def _hold_then_report(path, started, done):
    with cpu_kernels._build_lock(path):
        started.set()
        done.wait(10)


def test_a_second_builder_waits_for_the_first(tmp_path):
    build_dir = tmp_path / "cpu_kernels-avx2-4567"
    build_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    started, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_then_report, args=(build_dir, started, done))
    holder.start()
    try:
        assert started.wait(10)
        (build_dir / "lock").write_text("")  # the holder's build is running: its lock is not stale
        waiter_done = ctx.Event()
        waiter_done.set()  # the waiter lets go as soon as it holds the lock
        waiter = ctx.Process(target=_hold_then_report, args=(build_dir, ctx.Event(), waiter_done))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and (build_dir / "lock").exists()
        done.set()
        holder.join(10)
        waiter.join(15)
        assert waiter.exitcode == 0 and not (build_dir / "lock").exists()
    finally:
        done.set()
        holder.join(10)


def test_two_environments_with_one_torch_get_two_build_folders(monkeypatch):
    isa = IsaFeatures()
    here = cpu_kernels.build_key(isa)
    monkeypatch.setattr(sys, "prefix", sys.prefix + "-another-venv")
    assert cpu_kernels.build_key(isa) != here


def test_each_feature_set_has_its_own_build_key():
    keys = {cpu_kernels.build_key(IsaFeatures.parse(text)) for text in ("avx512_bf16", "avx512+avx512_vnni", "avx512", "avx2+avx_vnni", "avx2")}
    assert len(keys) == 5


def test_every_kernel_source_and_header_is_part_of_the_build_key():
    """A .cpp left out of SOURCES is never built; a header left out of HEADERS could change without changing the build
    key, so an install would keep a build of the old header."""
    folder = cpu_kernels.SOURCES[0].parent
    assert set(cpu_kernels.SOURCES) == set(folder.glob("*.cpp"))
    assert set(cpu_kernels.HEADERS) == set(folder.glob("*.h"))
