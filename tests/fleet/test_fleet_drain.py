"""SIGTERM to a fleet: every replica drains (streams in flight through the router finish), then the
router stops, the fleet exits 0 and no process of it is left; nor after SIGKILL to the supervisor."""

from __future__ import annotations

import asyncio
import re
import signal
import threading

import pytest

from testing.fleet_harness import REPLICA_TEST_FLAGS, FleetHarness
from testing.fleet_load import FleetRequest, send_all
from testing.processes import paused, wait_dead
from tests.fleet.conftest import ROUTER_MISSING

pytest.importorskip("sglang_router", reason=ROUTER_MISSING)
NUM_STREAMS = 8
NUM_TOKENS = 400  # none ends between the streams' first chunks and the SIGSTOP; 17-token prompts fit the 512 context
DRAIN_BEGUN = re.compile(r"replica \d \| .*draining: \d+ request\(s\) in flight finish")
DRAINED = re.compile(r"replica \d \| .*drained: (\d+) request\(s\) finished")


def test_sigterm_drains_every_replica_and_leaves_no_process(model_dir):
    """The streams are in flight when the drain begins however fast the machine: each replica's model
    process is stopped (SIGSTOP) from the moment every stream has its first chunk until both
    replicas' frontends have counted their in-flight requests, then let go to finish them."""
    fleet = FleetHarness.start(model_dir, num_replicas=2, flags=(*REPLICA_TEST_FLAGS, "--drain-timeout-s", "60"))
    try:
        pids = fleet.descendants()
        assert len(pids) >= 2 * 6 + 1  # 2 replicas x (launcher + 5 processes) + the router
        model_pids = [fleet.replica_child_pid(i, "model_proc") for i in range(2)]
        streams = [
            FleetRequest("/v1/completions", {"model": fleet.model_name, "prompt": f"story {i}: once upon a time",
                                             "max_tokens": NUM_TOKENS, "ignore_eos": True, "stream": True, "temperature": 0.0})
            for i in range(NUM_STREAMS)
        ]
        outcomes: list = []
        first_chunks: list[int] = []
        all_streaming = threading.Event()

        def on_first_chunk() -> None:  # the sender's event loop: one thread
            first_chunks.append(1)
            if len(first_chunks) == NUM_STREAMS:
                all_streaming.set()

        load = threading.Thread(target=lambda: outcomes.extend(asyncio.run(
            send_all(fleet.router_url, streams, concurrency=NUM_STREAMS, timeout_s=120, on_first_chunk=on_first_chunk))))
        load.start()
        assert all_streaming.wait(60), f"{len(first_chunks)} of {NUM_STREAMS} streams started\n{fleet.server.log_tail(60)}"
        with paused(model_pids):
            fleet.server.proc.send_signal(signal.SIGTERM)
            fleet.wait_for(lambda: len(DRAIN_BEGUN.findall(fleet.log())) == 2, 30, "both replicas draining")
        load.join(120)
        assert not load.is_alive()
        assert [o.error for o in outcomes if not o.ok] == []  # every stream finished with [DONE]
        assert fleet.server.proc.wait(timeout=60) == 0
        assert wait_dead(pids, 10) == [], [p for p in pids]
        drained = [int(n) for n in DRAINED.findall(fleet.log())]
        assert len(drained) == 2 and sum(drained) == NUM_STREAMS and min(drained) > 0, fleet.server.log_tail(80)
        assert "router stopped (exited with code 0)" in fleet.log()
    finally:
        fleet.kill()


def test_sigkill_to_the_supervisor_leaves_no_process(model_dir):
    """The replicas' launchers and the router die with the supervisor (PR_SET_PDEATHSIG), their children with them."""
    fleet = FleetHarness.start(model_dir, num_replicas=2)
    try:
        pids = fleet.descendants()
        fleet.server.proc.send_signal(signal.SIGKILL)
        fleet.server.proc.wait(timeout=10)
        assert wait_dead(pids, 10) == []
    finally:
        fleet.kill()
