"""2 replicas (one core each on a 2-core machine) behind sglang-router: a mixed load all succeeds
and spreads over both, requests sharing a prefix stay on one replica (its prefix cache hits as one
server's would), a replica SIGKILLed mid-load is taken out, restarted and serves again, and the router's exit
ends the fleet."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time

import pytest

from testing.fleet_load import mixed_requests, prefix_groups, send_all, send_groups
from testing.processes import wait_dead
from tests.fleet.conftest import ROUTER_MISSING

pytest.importorskip("sglang_router", reason=ROUTER_MISSING)


def stats_delta(fleet, before: list[dict]) -> list[dict]:
    return [{k: v - before[i][k] for k, v in fleet.replica_stats(i).items()} for i in range(fleet.num_replicas)]


def test_200_mixed_requests_through_the_router_all_succeed_on_both_replicas(fleet):
    before = [fleet.replica_stats(i) for i in range(2)]
    outcomes = asyncio.run(send_all(fleet.router_url, mixed_requests(200, fleet.model_name, seed=0), concurrency=8))
    failed = [(o.request.path, o.status, o.error) for o in outcomes if not o.ok]
    assert failed == [], failed[:5]
    finished = [d["num_finished"] for d in stats_delta(fleet, before)]
    assert sum(finished) == 200, finished  # every request ran once, on one replica
    assert min(finished) >= 20, finished  # the router used both


def test_requests_sharing_a_prefix_hit_the_cache_as_on_one_server(fleet):
    # one server alone (replica 0, directly), then the fleet through the router; same shapes, other text
    before = [fleet.replica_stats(i) for i in range(2)]
    alone = asyncio.run(send_groups(fleet.replica_urls[0], prefix_groups(6, 5, 60, tag="A", model=fleet.model_name)))
    single = stats_delta(fleet, before)[0]
    before = [fleet.replica_stats(i) for i in range(2)]
    routed = asyncio.run(send_groups(fleet.router_url, prefix_groups(6, 5, 60, tag="B", model=fleet.model_name)))
    per_replica = stats_delta(fleet, before)
    assert all(o.ok for o in alone + routed), [o.error for o in alone + routed if not o.ok][:3]
    single_rate = single["num_prefix_hit_tokens"] / single["num_prompt_tokens"]
    fleet_rate = sum(d["num_prefix_hit_tokens"] for d in per_replica) / sum(d["num_prompt_tokens"] for d in per_replica)
    print(f"prefix-cache hit rate: one server {single_rate:.3f}, fleet {fleet_rate:.3f}, per replica "
          f"{[round(d['num_prefix_hit_tokens'] / max(1, d['num_prompt_tokens']), 3) for d in per_replica]}")
    assert single_rate > 0.5  # the groups do share their prefixes
    assert fleet_rate >= 0.9 * single_rate
    assert all(d["num_finished"] > 0 for d in per_replica)  # groups went to both replicas, each group to one


def test_a_replica_killed_mid_load_is_taken_out_restarted_and_rejoins(fleet):
    victim_url = fleet.replica_urls[1]
    victim_pid = fleet.replica_pid(1)
    requests = mixed_requests(80, fleet.model_name, seed=1)
    outcomes: list = []
    load = threading.Thread(target=lambda: outcomes.extend(asyncio.run(send_all(fleet.router_url, requests, concurrency=8))))
    load.start()
    fleet.wait_for(lambda: all(fleet.replica_stats(i)["num_finished"] > 0 for i in range(2)), 30,
                   "both replicas serving the load")  # not a fixed sleep: a fast machine could finish the load in it
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    out_s = fleet.wait_for(lambda: not fleet.router_workers().get(victim_url, False), 10, "the dead replica left the router")
    load.join(60)
    assert not load.is_alive() and len(outcomes) == 80  # every request ended: none hung
    failed = [o for o in outcomes if not o.ok]
    assert len(failed) <= 8, [(o.status, o.error) for o in failed]  # at most what was in flight on the victim
    for outcome in failed:  # a clean failure: an HTTP error or a cut stream, never a hang
        assert outcome.status in (0, 200, 500, 502, 503) and outcome.error, outcome
    after_removal = asyncio.run(send_all(fleet.router_url, mixed_requests(20, fleet.model_name, seed=2), concurrency=4))
    assert [o.error for o in after_removal if not o.ok] == []  # sent only to the live replica
    rejoin_s = fleet.wait_for(lambda: fleet.router_workers().get(victim_url, False), 60, "the restarted replica rejoined")
    assert fleet.replica_pid(1) != victim_pid
    assert re.search(r"replica 1 \(pid \d+\) killed by SIGKILL .*taken out of the router; restarting", fleet.log())
    before = fleet.replica_stats(1)["num_finished"]
    rejoined = asyncio.run(send_all(fleet.router_url, mixed_requests(40, fleet.model_name, seed=3), concurrency=8))
    assert [o.error for o in rejoined if not o.ok] == []
    assert fleet.replica_stats(1)["num_finished"] > before  # the router sends to it again
    print(f"killed replica: out of the router after {out_s:.2f}s, back after {time.monotonic() - killed_at:.1f}s "
          f"(rejoin wait {rejoin_s:.1f}s); {len(failed)} of 80 in-flight requests failed: "
          f"{sorted({(o.status, o.error[:40]) for o in failed})}")


def test_the_router_exiting_ends_the_fleet_with_an_error_and_no_process_left(fleet):
    """Runs last: it ends the module's fleet."""
    pids = fleet.descendants()
    router_pid = fleet.router_pid()
    os.kill(router_pid, signal.SIGKILL)
    assert fleet.server.proc.wait(timeout=60) == 1
    assert wait_dead(pids, 10) == []
    assert "the router killed by SIGKILL; stopping the fleet" in fleet.log()
    assert len(re.findall(r"replica \d stopped \(exited with code 0\)", fleet.log())) == 2
