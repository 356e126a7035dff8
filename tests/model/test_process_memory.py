"""The worker's heap: freed pages handed back when it goes idle (model_proc/process_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from zserve.common.forward_batch import StepResult
from zserve.common.worker_env import worker_env
from zserve.model_proc.process_memory import IdleHeapRelease
from zserve.model_proc.worker_process import lead


class FakeClock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def make_release(clock: FakeClock, idle_s: float = 1.0) -> tuple[IdleHeapRelease, list[float]]:
    calls: list[float] = []
    return IdleHeapRelease(idle_s, release=lambda: calls.append(clock.now_s), clock=clock), calls


def test_nothing_is_due_before_a_step():
    clock = FakeClock()
    heap, calls = make_release(clock)
    assert heap.wait_ms() is None
    clock.now_s += 10
    assert heap.on_idle() is False
    assert calls == []


def test_released_once_after_the_idle_time_then_waits_for_the_next_step():
    clock = FakeClock()
    heap, calls = make_release(clock, idle_s=1.0)
    heap.step_done()
    assert heap.wait_ms() == 1000
    clock.now_s += 0.4
    assert heap.wait_ms() == 600
    assert heap.on_idle() is False  # a wait cut short (a heartbeat) does not release early
    clock.now_s += 0.6
    assert heap.wait_ms() == 0
    assert heap.on_idle() is True
    assert calls == [101.0]
    clock.now_s += 5
    assert heap.on_idle() is False and heap.wait_ms() is None  # once per busy spell
    heap.step_done()
    clock.now_s += 2
    assert heap.on_idle() is True
    assert calls == [101.0, 108.0]


def test_a_step_inside_the_idle_time_postpones_the_release():
    clock = FakeClock()
    heap, calls = make_release(clock, idle_s=1.0)
    heap.step_done()
    clock.now_s += 0.9
    heap.step_done()
    clock.now_s += 0.9
    assert heap.on_idle() is False
    clock.now_s += 0.1
    assert heap.on_idle() is True
    assert len(calls) == 1


def test_idle_time_must_be_positive():
    with pytest.raises(ValueError, match="idle_s"):
        IdleHeapRelease(0)


class ScriptedInbox:
    """recv_frame answers from a script: a batch, None (the wait timed out), or StopIteration ends the loop."""

    def __init__(self, script):
        self.script, self.timeouts_ms = list(script), []

    def recv_frame(self, timeout_ms):
        self.timeouts_ms.append(timeout_ms)
        if not self.script:
            raise StopIteration
        return self.script.pop(0)


class FakeBatch:
    step_id, num_tokens, num_reqs = 7, 3, 1
    input_ids = np.array([5, 6, 7], np.int32)  # no future tokens (overlap scheduling's; test_future_tokens.py)


class FakeRunner:
    def run(self, batch):
        return StepResult(step_id=batch.step_id, next_token_ids=np.array([9], np.int32), logprobs=np.zeros(1, np.float32))


class FakeResults:
    def __init__(self):
        self.sent = []

    def send(self, reply):
        self.sent.append(reply)


def test_the_lead_loop_waits_for_the_release_and_releases_when_idle():
    clock = FakeClock()
    heap, calls = make_release(clock, idle_s=1.0)
    inbox = ScriptedInbox([(b"frame", FakeBatch()), None])
    results = FakeResults()

    def timed_out_wait(timeout_ms):  # each timed-out wait lets the clock run for its length
        got = ScriptedInbox.recv_frame(inbox, timeout_ms)
        if got is None:
            clock.now_s += timeout_ms / 1000
        return got

    inbox.recv_frame = timed_out_wait
    with pytest.raises(StopIteration):
        lead(FakeRunner(), inbox, results, None, heap)
    assert [reply.step_id for reply in results.sent] == [7]
    assert inbox.timeouts_ms == [None, 1000, None]  # no wait bound before a step, none after the release
    assert calls == [101.0]


HEAP_PROBE = """
import sys
from zserve.model_proc.process_memory import release_freed_memory, resident_bytes
block = b"\\x01" * (256 << 20)
held = resident_bytes()
del block
kept = resident_bytes()
assert release_freed_memory()
print(held, kept, resident_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_freed_heap_stays_resident_under_the_workers_malloc_settings_until_released():
    env = {**os.environ, **worker_env(num_threads=1)}
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    held, kept, released = (int(v) for v in out.stdout.split())
    mib = 1 << 20
    assert kept > held - 32 * mib, "the worker's settings keep a freed block resident (the heap reuses it)"
    assert released < kept - 200 * mib, f"malloc_trim handed back {(kept - released) / mib:.0f} MiB of 256"
