"""The fleet check by hand: `launch_server --dp-size N --router` under a mixed load, a shared-prefix
load and a replica SIGKILLed mid-load, with the routing and fault figures printed.

    .venv/bin/python benchmarks/fleet_check.py                      # the tests' tiny random Llama
    .venv/bin/python benchmarks/fleet_check.py --model demo --prefix-words 200

Prints: requests per replica and failures for the mixed load (completions and chat, streamed or
not); the prefix-cache hit rate per replica through the router against one replica alone on the
same shapes of requests; after SIGKILL to a replica's launcher, the requests that failed, how long
until the router stopped listing it healthy, and until the restarted replica was back in the router
and served again. The same checks, asserted, are tests/fleet/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_info  # noqa: E402
from testing.fleet_harness import REPLICA_TEST_FLAGS, FleetHarness, bench_model_dir  # noqa: E402
from testing.fleet_load import mixed_requests, prefix_groups, send_all, send_groups  # noqa: E402
from testing.processes import wait_dead  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="model directory, 'demo' (SmolLM2-135M), or empty: the tests' tiny random Llama")
    p.add_argument("--num-replicas", type=int, default=2)
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prefix-words", type=int, default=60, help="words of the prefix a group of requests shares")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--server-flags", default=" ".join(REPLICA_TEST_FLAGS), help="launch_server flags of every replica")
    return p.parse_args(argv)


def finished_per_replica(fleet: FleetHarness) -> list[int]:
    return [fleet.replica_stats(i)["num_finished"] for i in range(fleet.num_replicas)]


def hit_rate(delta: dict[str, int]) -> float:
    return delta["num_prefix_hit_tokens"] / max(1, delta["num_prompt_tokens"])


def stats_delta(fleet: FleetHarness, before: list[dict]) -> list[dict]:
    return [{k: v - before[i][k] for k, v in fleet.replica_stats(i).items()} for i in range(fleet.num_replicas)]


def mixed_load(fleet: FleetHarness, args: argparse.Namespace) -> None:
    before = finished_per_replica(fleet)
    start = time.perf_counter()
    outcomes = asyncio.run(send_all(fleet.router_url, mixed_requests(args.num_requests, fleet.model_name), args.concurrency))
    wall_s = time.perf_counter() - start
    per_replica = [a - b for a, b in zip(finished_per_replica(fleet), before, strict=True)]
    failed = [o for o in outcomes if not o.ok]
    print(f"mixed load: {len(outcomes)} requests in {wall_s:.1f}s, {len(failed)} failed; requests per replica {per_replica}")
    for o in failed[:5]:
        print(f"  failed: {o.request.path} status {o.status}: {o.error}")


def prefix_load(fleet: FleetHarness, args: argparse.Namespace) -> None:
    before = [fleet.replica_stats(i) for i in range(fleet.num_replicas)]
    asyncio.run(send_groups(fleet.replica_urls[0], prefix_groups(8, 5, args.prefix_words, "A", fleet.model_name)))
    single = stats_delta(fleet, before)[0]
    before = [fleet.replica_stats(i) for i in range(fleet.num_replicas)]
    outcomes = asyncio.run(send_groups(fleet.router_url, prefix_groups(8, 5, args.prefix_words, "B", fleet.model_name)))
    per_replica = stats_delta(fleet, before)
    total = {k: sum(d[k] for d in per_replica) for k in per_replica[0]}
    print(f"shared prefixes (8 groups x 5 requests, {args.prefix_words}-word prefix): hit rate one replica alone "
          f"{hit_rate(single):.3f}, fleet {hit_rate(total):.3f} ({hit_rate(total) / max(hit_rate(single), 1e-9):.2f}x); "
          f"per replica {[round(hit_rate(d), 3) for d in per_replica]}, requests {[d['num_finished'] for d in per_replica]}, "
          f"failed {sum(not o.ok for o in outcomes)}")


def kill_and_rejoin(fleet: FleetHarness, args: argparse.Namespace) -> None:
    victim_idx = fleet.num_replicas - 1
    victim_url, victim_pid = fleet.replica_urls[victim_idx], fleet.replica_pid(victim_idx)
    outcomes: list = []
    requests = mixed_requests(80, fleet.model_name, seed=1)
    load = threading.Thread(target=lambda: outcomes.extend(asyncio.run(send_all(fleet.router_url, requests, args.concurrency))))
    load.start()
    time.sleep(1.0)
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    out_s = fleet.wait_for(lambda: not fleet.router_workers().get(victim_url, False), 30, "taken out")
    load.join(120)
    rejoin_s = fleet.wait_for(lambda: fleet.router_workers().get(victim_url, False), 120, "rejoined", poll_s=0.1)
    rejoined_after_s = time.monotonic() - killed_at
    before = fleet.replica_stats(victim_idx)["num_finished"]
    after = asyncio.run(send_all(fleet.router_url, mixed_requests(40, fleet.model_name, seed=3), args.concurrency))
    served = fleet.replica_stats(victim_idx)["num_finished"] - before
    failed = [o for o in outcomes if not o.ok]
    kinds = Counter(f"status {o.status}: {o.error[:50]}" for o in failed)
    print(f"SIGKILL to replica {victim_idx} mid-load: {len(failed)} of {len(outcomes)} requests failed {dict(kinds)}; "
          f"out of the router after {out_s:.2f}s; restarted and back in the router {rejoined_after_s:.1f}s after the kill "
          f"(waited {rejoin_s:.1f}s after the load ended); then it served {served} of 40 requests "
          f"({sum(not o.ok for o in after)} failed)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = bench_model_dir(args.model, Path(tmp))
        start = time.perf_counter()
        fleet = FleetHarness.start(model, args.num_replicas, tuple(args.server_flags.split()), policy=args.policy, timeout_s=600)
        try:
            info = machine_info()
            print(f"fleet of {args.num_replicas} replica(s) + sglang-router ({args.policy}) ready in {time.perf_counter() - start:.1f}s; "
                  f"model {Path(model).name}; {info['cpu']}, {info['num_cores']} cores, load average {info['load_average'][0]:.2f}")
            mixed_load(fleet, args)
            prefix_load(fleet, args)
            kill_and_rejoin(fleet, args)
            pids, stop_start = fleet.descendants(), time.perf_counter()
            code = fleet.stop()
            print(f"SIGTERM: the fleet drained and exited {code} in {time.perf_counter() - stop_start:.1f}s; "
                  f"of its {len(pids)} processes, {len(wait_dead(pids, 5))} left running")
        finally:
            fleet.kill()


if __name__ == "__main__":
    main()
