"""What sglang-router in front of a replica costs: TTFT and latency through the router minus direct.

    .venv/bin/python benchmarks/router_overhead.py                   # the tests' tiny random Llama
    .venv/bin/python benchmarks/router_overhead.py --model demo --concurrency 4

Starts `launch_server --dp-size 1 --router` (one replica, so the router can only pick it) with the
prefix cache off (a repeated prompt costs the same every time), then sends the same streamed
completions to the router and to the replica directly, interleaved (one batch each way in turn, the
order alternating), so both paths see the same prompts, server and machine load. Prints p50 / p90 of
TTFT and end-to-end latency per path, the router's cost at p50 and as the median of paired
differences, the router process's CPU time per request, the load average and the CPU model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_info  # noqa: E402
from testing.fleet_harness import FleetHarness, bench_model_dir  # noqa: E402
from testing.http_client import HttpClient  # noqa: E402

PASSAGE = "Routers add a hop: a connection, a parse of the body, a policy decision and a copy of every chunk. "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="model directory, 'demo' (SmolLM2-135M), or empty: the tests' tiny random Llama")
    p.add_argument("--num-requests", type=int, default=60, help="measured requests per path")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight per batch")
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--num-warmup", type=int, default=4)
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--server-flags", default="--dtype float32 --kv-cache-tokens 32768 --disable-radix-cache --log-stats-interval-s 0")
    return p.parse_args(argv)


def prompts(num: int, num_chars: int, tag: str) -> list[str]:
    text = PASSAGE * (num_chars // len(PASSAGE) + 2)
    return [f"{tag} {i}. " + text[i % len(PASSAGE):][:num_chars] for i in range(num)]


async def timed(client: HttpClient, prompt: str, max_tokens: int) -> tuple[float, float]:
    result = await client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    assert result.finish_reason == "length", result
    return result.ttft_s, result.latency_s


async def measure(router_url: str, replica_url: str, model: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    runs = {name: {"ttft": [], "latency": []} for name in ("direct", "router")}
    async with HttpClient(router_url, model=model) as via_router, HttpClient(replica_url, model=model) as direct:
        clients = {"direct": direct, "router": via_router}
        for name, client in clients.items():
            await asyncio.gather(*(timed(client, p, args.max_tokens) for p in prompts(args.num_warmup, args.prompt_chars, f"warm {name}")))
        all_prompts = prompts(args.num_requests, args.prompt_chars, "req")
        for batch_idx, start in enumerate(range(0, len(all_prompts), args.concurrency)):
            batch = all_prompts[start:start + args.concurrency]
            for name in ("direct", "router") if batch_idx % 2 == 0 else ("router", "direct"):
                for ttft_s, latency_s in await asyncio.gather(*(timed(clients[name], p, args.max_tokens) for p in batch)):
                    runs[name]["ttft"].append(ttft_s)
                    runs[name]["latency"].append(latency_s)
    return runs


def report(runs: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| path | TTFT p50 (ms) | TTFT p90 (ms) | latency p50 (ms) | latency p90 (ms) |", "|---|---|---|---|---|"]
    for name, r in runs.items():
        t50, t90 = np.percentile(r["ttft"], [50, 90]) * 1e3
        l50, l90 = np.percentile(r["latency"], [50, 90]) * 1e3
        lines.append(f"| {name} | {t50:.2f} | {t90:.2f} | {l50:.2f} | {l90:.2f} |")
    for metric in ("ttft", "latency"):
        direct, routed = np.array(runs["direct"][metric]), np.array(runs["router"][metric])
        p50_ms = (np.percentile(routed, 50) - np.percentile(direct, 50)) * 1e3
        paired_ms = float(np.median(routed - direct)) * 1e3
        lines.append(f"router - direct, {metric}: p50 {p50_ms:+.2f} ms ({100 * p50_ms / (np.percentile(direct, 50) * 1e3):+.1f}%), "
                     f"median of paired differences {paired_ms:+.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = bench_model_dir(args.model, Path(tmp))
        fleet = FleetHarness.start(model, 1, tuple(args.server_flags.split()), policy=args.policy, timeout_s=600)
        try:
            router_pid = fleet.router_pid()
            start, router_cpu0_s = time.perf_counter(), cpu_time_s(router_pid)
            runs = asyncio.run(measure(fleet.router_url, fleet.replica_urls[0], fleet.model_name, args))
            wall_s, router_cpu_s = time.perf_counter() - start, cpu_time_s(router_pid) - router_cpu0_s
        finally:
            fleet.stop()
            fleet.kill()
    info = machine_info()
    print(f"model {Path(model).name}; {args.num_requests} streamed completions per path, {args.prompt_chars}-char prompts, "
          f"{args.max_tokens} output tokens, {args.concurrency} in flight, paths interleaved; {wall_s:.1f}s")
    print(f"CPU {info['cpu']}, {info['num_cores']} cores; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(report(runs))
    num_routed = args.num_requests + args.num_warmup
    print(f"router CPU time: {router_cpu_s:.2f} s for {num_routed} requests, {router_cpu_s / num_routed * 1e3:.2f} ms a request "
          f"(user + system, /proc; its health checks included)")


def cpu_time_s(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
