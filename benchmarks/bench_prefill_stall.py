"""How long decoding streams freeze when a long prompt arrives (issue 46, `--max-step-ms`).

    .venv/bin/python benchmarks/bench_prefill_stall.py --model /tmp/shaped/llama1b-q4_k_m.gguf \\
        --zserve-variant "bounded=--max-step-ms 0" --zserve-variant "tokens-only=--max-step-ms -1" --rounds 2

Per server variant and round: `--streams` greedy streams (random token-id prompts of `--stream-input-len`,
ignore_eos) decode for `--settle-s`, then one `--long-input-len`-token prompt (max_tokens 1) is sent. From each
stream's token arrival times: ITL p50 before the prompt arrived, and the worst gap while the prompt was being
prefilled (from its send to its first token); the long prompt's TTFT. Variants run one after the other, rounds
interleave them; the CPU and the load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gguf_start import first_answer, free_port, stop_server  # noqa: E402


@dataclass
class Stream:
    times_s: list[float] = field(default_factory=list)  # each token's arrival (perf_counter)


def stream_completion(base: str, model: str, input_ids: list[int], max_tokens: int, out: Stream) -> None:
    body = {"model": model, "prompt": input_ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]" and json.loads(line[5:]).get("choices"):
                out.times_s.append(time.perf_counter())


def one_round(base: str, model: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    streams = [Stream() for _ in range(args.streams)]
    threads = [threading.Thread(target=stream_completion, args=(
        base, model, [rng.randrange(1000, 40000) for _ in range(args.stream_input_len)], args.stream_output_len, s))
        for s in streams]
    for thread in threads:
        thread.start()
    time.sleep(args.settle_s)
    long_stream = Stream()
    sent_s = time.perf_counter()
    stream_completion(base, model, [rng.randrange(1000, 40000) for _ in range(args.long_input_len)], 1, long_stream)
    first_token_s = long_stream.times_s[0]
    for thread in threads:
        thread.join()
    before, during = [], []
    for s in streams:
        gaps = list(zip(s.times_s, s.times_s[1:], strict=False))
        before += [b - a for a, b in gaps if b < sent_s and a > sent_s - args.settle_s / 2]
        during += [b - a for a, b in gaps if b > sent_s and a < first_token_s]
    itl_ms = statistics.median(before) * 1e3 if before else float("nan")
    worst_ms = max(during) * 1e3 if during else float("nan")
    return {"itl_p50_ms": itl_ms, "worst_gap_ms": worst_ms, "gap_over_itl": worst_ms / itl_ms,
            "long_ttft_s": first_token_s - sent_s}


def run_variant(name: str, flags: str, args: argparse.Namespace, round_idx: int) -> dict[str, float]:
    port = free_port()
    cmd = [sys.executable, "-m", "zserve.launcher", "--model", str(args.model), "--port", str(port),
           "--kv-cache-tokens", str(args.context), "--log-level", "warning", *args.zserve_args.split(), *flags.split()]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model, _ = first_answer(base, time.perf_counter() + args.start_timeout_s)
        return one_round(base, model, args, seed=round_idx)
    finally:
        stop_server(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a model directory or a .gguf file")
    p.add_argument("--zserve-variant", action="append", default=[], metavar="NAME=FLAGS")
    p.add_argument("--zserve-args", default="", help="flags for every variant")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stream-input-len", type=int, default=64)
    p.add_argument("--stream-output-len", type=int, default=160)
    p.add_argument("--long-input-len", type=int, default=1500)
    p.add_argument("--settle-s", type=float, default=4.0, help="seconds the streams decode before the long prompt")
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--start-timeout-s", type=float, default=600.0)
    args = p.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    print(f"CPU: {cpu}; load average before: {os.getloadavg()[0]:.2f}; model {args.model}; {args.streams} streams, "
          f"a {args.long_input_len}-token prompt after {args.settle_s} s", flush=True)
    for round_idx in range(args.rounds):
        for variant in args.zserve_variant or ["zserve="]:
            name, _, flags = variant.partition("=")
            r = run_variant(name, flags, args, round_idx)
            print(f"  round {round_idx} {name:12s} ITL p50 before {r['itl_p50_ms']:7.1f} ms  worst gap during the "
                  f"prefill {r['worst_gap_ms']:7.1f} ms ({r['gap_over_itl']:.1f}x)  long prompt TTFT "
                  f"{r['long_ttft_s']:.2f} s", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
