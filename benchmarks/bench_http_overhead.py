"""TTFT through the HTTP front end against the ZMQ client: one server, one workload, one run.

    .venv/bin/python benchmarks/bench_http_overhead.py                    # the tiny random Llama of the tests
    .venv/bin/python benchmarks/bench_http_overhead.py --model ~/.cache/zserve/SmolLM2-135M-Instruct

Starts one `launch_server --http-port` with the prefix cache off (a repeated prompt costs the
same every time), then sends each request of the workload twice, once through `AsyncClient`
(ZMQ) and once through `testing.http_client.HttpClient` (POST /v1/completions, SSE), in
alternating order, one request at a time, so both paths see the same prompts, the same server
and the same machine load. Both time TTFT the same way: from just before the send to the first
text. Prints p50 / p90 of TTFT, end-to-end latency and inter-chunk gaps per path, and the HTTP
overhead at p50, also as the median of per-prompt differences (robust to a machine whose load
drifts during the run).
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

from testing.http_client import HttpClient  # noqa: E402
from testing.server_process import start_server  # noqa: E402
from zserve.client import AsyncClient  # noqa: E402
from zserve.common.net_ports import free_port  # noqa: E402

PASSAGE = (
    "The history of computing is a story of layers: each generation of engineers builds on the abstractions "
    "of the last, and the best of them make the layer below disappear from view. "
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="model directory (default: build the tests' tiny random Llama)")
    p.add_argument("--num-requests", type=int, default=40, help="requests per path")
    p.add_argument("--prompt-chars", type=int, default=600, help="characters per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--num-warmup", type=int, default=3, help="unmeasured requests per path first")
    # a small KV pool: the scheduler checks every page when it goes idle, which between one-at-a-time
    # requests would otherwise cost far more than the HTTP hop being measured
    p.add_argument("--server-flags", default="--num-threads 1 --kv-cache-tokens 32768", help="extra launch_server flags")
    return p.parse_args(argv)


def prompts(num: int, num_chars: int) -> list[str]:
    text = PASSAGE * (num_chars // len(PASSAGE) + 2)
    return [f"Request {i}. " + text[i % len(PASSAGE) :][:num_chars] for i in range(num)]


async def timed(client: AsyncClient | HttpClient, prompt: str, max_tokens: int) -> tuple[float, float, list[float]]:
    """(ttft_s, latency_s, gaps between text chunks) of one greedy streamed request."""
    sent_s = time.perf_counter()
    chunk_times_s: list[float] = []
    async for delta, result in client.stream_outputs(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
        if delta:
            chunk_times_s.append(time.perf_counter() - sent_s)
        if result.finish_reason is not None:
            assert result.finish_reason == "length", result
    latency_s = time.perf_counter() - sent_s
    return chunk_times_s[0], latency_s, list(np.diff(chunk_times_s))


async def measure(zmq_port: int, http_url: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    runs = {name: {"ttft": [], "latency": [], "gap": []} for name in ("zmq", "http")}
    async with AsyncClient(zmq_port) as zmq_client, HttpClient(http_url) as http_client:
        clients = {"zmq": zmq_client, "http": http_client}
        for c in clients.values():
            for prompt in prompts(args.num_warmup, args.prompt_chars):
                await timed(c, prompt, args.max_tokens)
        for i, prompt in enumerate(prompts(args.num_requests, args.prompt_chars)):
            order = ("zmq", "http") if i % 2 == 0 else ("http", "zmq")
            for name in order:
                ttft_s, latency_s, gaps_s = await timed(clients[name], prompt, args.max_tokens)
                runs[name]["ttft"].append(ttft_s)
                runs[name]["latency"].append(latency_s)
                runs[name]["gap"].extend(gaps_s)
    return runs


def report(runs: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| path | TTFT p50 (ms) | TTFT p90 (ms) | latency p50 (ms) | latency p90 (ms) | chunk gap p50 (ms) |",
             "|---|---|---|---|---|---|"]
    p50 = {}
    for name, r in runs.items():
        t50, t90 = np.percentile(r["ttft"], [50, 90]) * 1e3
        l50, l90 = np.percentile(r["latency"], [50, 90]) * 1e3
        g50 = np.percentile(r["gap"], 50) * 1e3 if r["gap"] else float("nan")
        p50[name] = t50
        lines.append(f"| {name} | {t50:.2f} | {t90:.2f} | {l50:.2f} | {l90:.2f} | {g50:.2f} |")
    extra_ms = p50["http"] - p50["zmq"]
    paired_ms = float(np.median(np.subtract(runs["http"]["ttft"], runs["zmq"]["ttft"]))) * 1e3
    lines.append(f"\nHTTP TTFT overhead at p50: {extra_ms:+.2f} ms ({100 * extra_ms / p50['zmq']:+.1f}%)")
    lines.append(f"median of paired differences (same prompt, back to back): {paired_ms:+.2f} ms "
                 f"({100 * paired_ms / p50['zmq']:+.1f}% of the ZMQ p50)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            from testing.e2e_fixtures import build_tiny_llama_dir

            model = str(build_tiny_llama_dir(Path(tmp) / "tiny-llama"))
        http_port = free_port()
        flags = ["--http-port", str(http_port), "--disable-radix-cache", *args.server_flags.split()]
        server = start_server(model, *flags, timeout_s=600)
        try:
            runs = measure_sync(server.port, f"http://127.0.0.1:{http_port}", args)
        finally:
            server.stop()
    print(f"model {Path(model).name}; {args.num_requests} requests per path, {args.prompt_chars}-char prompts, "
          f"{args.max_tokens} output tokens, one at a time, alternating paths; load average {os.getloadavg()[0]:.1f}")
    print(report(runs))


def measure_sync(zmq_port: int, http_url: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    return asyncio.run(measure(zmq_port, http_url, args))


if __name__ == "__main__":
    main()
