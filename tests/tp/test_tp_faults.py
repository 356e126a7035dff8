"""A tensor-parallel rank dies mid-request: the client gets an error, every process exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from testing.processes import wait_dead
from testing.server_process import start_server
from zserve.client import Client, ServerError

FLAGS = ("--kv-cache-tokens", "2048", "--num-threads", "1", "--tp-size", "2")



@pytest.mark.parametrize("rank", [1, 0])
def test_sigkill_of_a_rank_fails_in_flight_requests_and_exits(model_dir, rank):
    handle = start_server(model_dir, *FLAGS, timeout_s=240)
    children = handle.child_pids()
    assert len(children) == 5, handle.log()  # two ranks, scheduler, detokenizer, tokenizer
    with Client(handle.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        os.kill(handle.rank_pid(rank), signal.SIGKILL)
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
        [sys.executable, "-m", "zserve.launcher", "--model", str(model_dir), "--zmq-port", "0", "--port", "0", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
