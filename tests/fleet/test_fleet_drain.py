"""SIGTERM to a fleet: every replica drains (streams in flight through the router finish), then the
router stops, the fleet exits 0 and no process of it is left; nor after SIGKILL to the supervisor."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import pytest

from testing.fleet_harness import REPLICA_TEST_FLAGS, FleetHarness
from testing.fleet_load import FleetRequest, send_all
from testing.processes import wait_dead
from tests.fleet.conftest import ROUTER_MISSING

pytest.importorskip("sglang_router", reason=ROUTER_MISSING)
NUM_STREAMS = 8


def test_sigterm_drains_every_replica_and_leaves_no_process(model_dir):
    fleet = FleetHarness.start(model_dir, num_replicas=2, flags=(*REPLICA_TEST_FLAGS, "--drain-timeout-s", "60"))
    try:
        pids = fleet.descendants()
        assert len(pids) >= 2 * 6 + 1  # 2 replicas x (launcher + 5 processes) + the router
        streams = [
            FleetRequest("/v1/completions", {"model": fleet.model_name, "prompt": f"story {i}: once upon a time",
                                             "max_tokens": 160, "ignore_eos": True, "stream": True, "temperature": 0.0})
            for i in range(NUM_STREAMS)
        ]
        outcomes: list = []
        load = threading.Thread(target=lambda: outcomes.extend(asyncio.run(send_all(fleet.router_url, streams, concurrency=NUM_STREAMS))))
        load.start()
        fleet.wait_for(lambda: all(fleet.replica_stats(i)["num_generated_tokens"] > 0 for i in range(2)), 30,
                       "both replicas generating")
        time.sleep(0.3)
        fleet.server.proc.send_signal(signal.SIGTERM)
        load.join(90)
        assert not load.is_alive()
        assert [o.error for o in outcomes if not o.ok] == []  # every stream finished with [DONE]
        assert fleet.server.proc.wait(timeout=60) == 0
        assert wait_dead(pids, 10) == [], [p for p in pids]
        drained = [int(n) for n in re.findall(r"replica \d \| .*drained: (\d+) request\(s\) finished", fleet.log())]
        assert len(drained) == 2 and sum(drained) == NUM_STREAMS, fleet.server.log_tail(80)
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
