"""A tensor-parallel rank dies mid-request: the client gets an error, every process exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from client import Client, ServerError
from tests.e2e_fixtures import build_tiny_llama_dir
from tests.server_harness import ServerHandle, pid_alive, start_server

FLAGS = ("--kv-cache-tokens", "2048", "--num-threads", "1", "--tp-size", "2")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama-tp-faults"))


def rank_pid(handle: ServerHandle, rank: int) -> int:
    """The pid of the launcher's child running model worker rank `rank`."""
    for pid in handle.child_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if b"model_proc" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode():
            return pid
    raise AssertionError(f"no child runs rank {rank}")


def wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


@pytest.mark.parametrize("rank", [1, 0])
def test_sigkill_of_a_rank_fails_in_flight_requests_and_exits(model_dir, rank):
    handle = start_server(model_dir, *FLAGS, timeout_s=240)
    children = handle.child_pids()
    assert len(children) == 5, handle.log()  # two ranks, scheduler, detokenizer, tokenizer
    with Client(handle.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        os.kill(rank_pid(handle, rank), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match="model rank"):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 15
    assert handle.proc.wait(timeout=20) != 0
    assert wait_dead(children, 10) == [], handle.log()
    assert f"model rank {rank} process killed by SIGKILL" in handle.log()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--tp-size", "3"), "the model's 4 attention heads do not split evenly across 3 ranks"),
        (("--tp-size", "2", "--nnodes", "2"), "--nnodes > 1 needs --dist-init-addr"),
    ],
)
def test_impossible_rank_flags_are_refused_before_anything_starts(model_dir, flags, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "--model", str(model_dir), *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
