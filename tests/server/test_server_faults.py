"""Process faults: a dead model worker, SIGTERM and SIGKILL of the launcher. Nothing may hang or linger."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from testing.processes import paused, wait_dead
from testing.server_process import free_port, start_server
from zserve.client import AsyncClient, Client, ServerError, ServerGoneError
from zserve.launcher.runtime_dir import OWNER_FILE, PREFIX, sweep_orphans

FLAGS = ("--kv-cache-tokens", "2048", "--num-threads", "1")



def test_sigkill_of_model_worker_fails_requests_and_exits_nonzero(model_dir):
    handle = start_server(model_dir, *FLAGS)
    children = handle.child_pids()
    assert len(children) == 4, handle.log()
    model_pid = handle.child_pid("model_proc")  # looked up first: the kill lands right after the first token
    with Client(handle.port, timeout_s=30) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        stats = c.stats()
        assert stats["num_running"] == 1
        os.kill(model_pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match="model"):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 10
    code = handle.proc.wait(timeout=15)
    assert code != 0
    assert wait_dead(children, 5) == [], handle.log()
    assert "model process killed by SIGKILL" in handle.log()


def test_sigterm_of_launcher_aborts_in_flight_and_ends_all(model_dir):
    """With --drain-timeout-s 0, SIGTERM aborts what is in flight at once (no drain). The model
    process is stopped until the stream ends, so it cannot finish first however fast the machine."""
    handle = start_server(model_dir, *FLAGS, "--drain-timeout-s", "0")
    children = handle.child_pids()
    model_pid = handle.child_pid("model_proc")
    with Client(handle.port, timeout_s=30) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        with paused([model_pid]):
            handle.proc.send_signal(signal.SIGTERM)
            for _ in stream:
                pass
        assert stream.result.finish_reason == "abort"
    assert handle.proc.wait(timeout=15) == 0
    assert wait_dead(children, 5) == []


def test_sigkill_of_launcher_leaves_no_process_behind(model_dir):
    """... and the runtime directory it leaves is removed by the next launcher's sweep."""
    handle = start_server(model_dir, *FLAGS)
    children = handle.child_pids()
    assert len(children) == 4
    owned = [d for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}*") if (d / OWNER_FILE).is_file() and (d / OWNER_FILE).read_text().split()[0] == str(handle.proc.pid)]
    assert len(owned) == 1
    handle.proc.send_signal(signal.SIGKILL)
    handle.proc.wait(timeout=5)
    assert wait_dead(children, 5) == [], "children outlived a SIGKILLed launcher"
    assert owned[0].exists()  # nobody cleaned up: the launcher was killed
    assert owned[0] in sweep_orphans()  # what a new launcher does first
    assert not owned[0].exists()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--context-length", "-1"), "argument --context-length: must be >= 0, got -1"),
        (("--context-length", "513"), "--context-length 513 is above the model's maximum context length of 512 tokens"),
        (("--prefill-max-requests", "-2"), "argument --prefill-max-requests: must be >= 0, got -2"),
        (("--schedule-conservativeness", "0"), "argument --schedule-conservativeness: must be > 0.0, got 0"),
        (("--kv-reservation", "lazy"), "argument --kv-reservation: invalid choice: 'lazy'"),
    ],
)
def test_bad_scheduling_flags_are_refused_before_anything_starts(model_dir, flags, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "zserve.launcher", "--model", str(model_dir), "--zmq-port", "0", "--port", "0", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "ready" not in proc.stdout


@pytest.mark.parametrize("victim", ["tokenizer_proc", "launcher"])
def test_sigkill_of_frontend_or_launcher_fails_both_clients_within_5s(model_dir, victim):
    """The sync and the async client each learn within 5 s, from their socket's monitor, not the
    15 s heartbeat, and the error names the cause."""
    handle = start_server(model_dir, *FLAGS)
    children = handle.child_pids()
    victim_pid = handle.proc.pid if victim == "launcher" else handle.child_pid(victim)  # looked up before the streams
    streaming, seen = threading.Event(), {}

    async def async_side() -> None:
        async with AsyncClient(handle.port, timeout_s=60) as ac:
            try:
                async for _ in ac.stream("Once upon a time", max_tokens=400, ignore_eos=True):
                    streaming.set()
            except ServerGoneError as exc:
                seen["async"] = (time.monotonic(), str(exc))

    thread = threading.Thread(target=lambda: asyncio.run(async_side()))
    thread.start()
    with Client(handle.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        assert streaming.wait(30)
        os.kill(victim_pid, signal.SIGKILL)
        killed_s = time.monotonic()
        with pytest.raises(ServerGoneError, match="closed the connection: its frontend process exited"):
            for _ in stream:
                pass
        sync_s = time.monotonic()
    thread.join(30)
    assert "closed the connection" in seen["async"][1]
    assert sync_s - killed_s < 5 and seen["async"][0] - killed_s < 5, (sync_s - killed_s, seen["async"][0] - killed_s)
    handle.proc.wait(timeout=15)
    assert wait_dead(children, 10) == [], handle.log()


@pytest.mark.parametrize(
    ("victim", "name"), [("scheduler_proc", "scheduler"), ("detokenizer_proc", "detokenizer"), ("model_proc", "model"), ("http_proc", "http")]
)
def test_sigkill_of_a_back_process_fails_streams_within_5s_naming_it(model_dir, victim, name):
    handle = start_server(model_dir, *FLAGS, *(("--http-port", str(free_port())) if victim == "http_proc" else ()))
    children = handle.child_pids()
    victim_pid = handle.child_pid(victim)  # looked up first: the kill lands right after the first token
    with Client(handle.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        next(iter(stream))
        os.kill(victim_pid, signal.SIGKILL)
        killed_s = time.monotonic()
        with pytest.raises(ServerError, match=f"the {name} process killed by SIGKILL"):
            for _ in stream:
                pass
        assert time.monotonic() - killed_s < 5
    assert handle.proc.wait(timeout=15) != 0
    assert wait_dead(children, 10) == [], handle.log()
