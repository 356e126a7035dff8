"""Graceful drain: SIGTERM (or a first Ctrl-C) lets in-flight requests finish while new ones are
refused, then everything exits 0; a second signal aborts what is left at once."""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from testing.processes import paused, wait_dead
from testing.server_process import start_server
from zserve.client import Client, ServerError, ServerShuttingDownError

FLAGS = ("--dtype", "float32", "--kv-cache-tokens", "8192", "--num-threads", "1", "--max-running-requests", "8")
PROMPTS = [f"Story number {i}: once upon a time" for i in range(8)]
NUM_TOKENS = 200
DRAIN_BEGUN = "draining: 8 request(s) in flight finish"  # the frontend counted the 8 streams


@pytest.fixture(scope="module")
def expected(model_dir):
    """The 8 prompts' greedy outputs on an undisturbed server."""
    server = start_server(model_dir, *FLAGS)
    try:
        with Client(server.port, timeout_s=120) as c:
            return [c.generate(p, max_tokens=NUM_TOKENS, ignore_eos=True).output_ids for p in PROMPTS]
    finally:
        assert server.stop() == 0


def stream_all(port: int, results: list, errors: list, first_output: threading.Event) -> None:
    try:
        with Client(port, timeout_s=120) as c:
            streams = [c.stream(p, max_tokens=NUM_TOKENS, ignore_eos=True) for p in PROMPTS]
            iterators = [iter(s) for s in streams]
            for it in iterators:
                next(it)
            first_output.set()
            for it in iterators:
                for _ in it:
                    pass
            results.extend(s.result for s in streams)
    except BaseException as exc:  # reported by the test
        errors.append(exc)
        first_output.set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stop_signal_drains_8_streams_refuses_new_requests_and_exits_0(model_dir, expected, sig):
    """The model process is stopped (SIGSTOP) from the streams' first outputs until the frontend has
    counted them and refused a new request, so all 8 are in flight however fast the machine."""
    server = start_server(model_dir, *FLAGS, "--drain-timeout-s", "60")
    children = server.child_pids()
    model_pid = server.child_pid("model_proc")
    results, errors, first_output = [], [], threading.Event()
    thread = threading.Thread(target=stream_all, args=(server.port, results, errors, first_output))
    thread.start()
    assert first_output.wait(60) and not errors, errors
    with paused([model_pid]):
        server.proc.send_signal(sig)
        server.wait_logged(DRAIN_BEGUN)
        with Client(server.port, timeout_s=30) as c, pytest.raises(ServerShuttingDownError, match="server shutting down"):
            c.generate("too late", max_tokens=4)  # a request sent during the drain is refused
    thread.join(120)
    assert not errors, errors
    assert [r.finish_reason for r in results] == ["length"] * 8
    assert [r.output_ids for r in results] == expected  # every stream got its full greedy output
    assert server.proc.wait(timeout=30) == 0
    assert wait_dead(children, 5) == []
    drained = re.search(r"drained: (\d+) request\(s\) finished", server.log())
    assert drained and int(drained.group(1)) == 8, server.log_tail()


def test_second_signal_aborts_the_drain(model_dir):
    """The model process is stopped until the stream ends, so it cannot finish before the abort
    however fast the machine."""
    server = start_server(model_dir, *FLAGS, "--drain-timeout-s", "60")
    children = server.child_pids()
    model_pid = server.child_pid("model_proc")
    with Client(server.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=500, ignore_eos=True)
        next(iter(stream))
        with paused([model_pid]):
            server.proc.send_signal(signal.SIGTERM)
            server.wait_logged("draining in-flight requests", 10)
            server.proc.send_signal(signal.SIGTERM)
            for _ in stream:
                pass
        assert stream.result.finish_reason == "abort"
    assert server.proc.wait(timeout=30) == 0
    assert wait_dead(children, 5) == []
    assert "second stop signal: aborting" in server.log(), server.log_tail()


def test_a_process_dying_during_the_drain_fails_the_streams_naming_it_and_exits_1(model_dir):
    server = start_server(model_dir, *FLAGS, "--drain-timeout-s", "60")
    children = server.child_pids()
    model_pid = server.child_pid("model_proc")
    with Client(server.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=500, ignore_eos=True)
        next(iter(stream))
        os.kill(model_pid, signal.SIGSTOP)  # the stream cannot finish: the drain waits
        server.proc.send_signal(signal.SIGTERM)
        server.wait_logged("draining in-flight requests", 10)
        os.kill(model_pid, signal.SIGKILL)
        with pytest.raises(ServerError, match="model"):
            for _ in stream:
                pass
    assert server.proc.wait(timeout=30) == 1
    assert wait_dead(children, 5) == []
