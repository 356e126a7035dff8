"""What an embedding costs against the prefill it is: POST /v1/embeddings on a `--task embed` server against
/v1/completions with max_tokens=1 on a generating one, the same inputs, interleaved.

    .venv/bin/python benchmarks/bench_embeddings.py                  # the demo model (SmolLM2-135M)
    .venv/bin/python benchmarks/bench_embeddings.py --batch 64 --rounds 5 --dtype bfloat16

Both servers run at once with the same flags (the generating one with the prefix cache off, as an embedding
server runs), but only one is sent work at a time: each round sends the batch to one and then the other, the
order alternating, so both see the same machine load. Checks the answers (unit-norm vectors of the model's
hidden size; one token of text per completion) and prints tokens/s per path, the median ratio of the paired
rounds, the load average and the CPU model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_info  # noqa: E402
from testing.fleet_harness import bench_model_dir  # noqa: E402
from testing.server_process import free_port, start_server  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog. " * 12  # about 120 tokens


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo", help='"demo", a model directory, or "" for a tiny random Llama')
    p.add_argument("--batch", type=int, default=32, help="inputs per request (one /v1/embeddings, n completions)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-threads", type=int, default=os.cpu_count() or 1)
    return p.parse_args(argv)


def post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def embed_round(port: int, inputs: list[str]) -> tuple[float, int]:
    """(seconds, prompt tokens) of one /v1/embeddings request; checks the vectors."""
    t0 = time.perf_counter()
    out = post(port, "/v1/embeddings", {"input": inputs})
    seconds = time.perf_counter() - t0
    vectors = np.array([d["embedding"] for d in out["data"]], dtype=np.float32)
    assert vectors.shape[0] == len(inputs) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    return seconds, out["usage"]["prompt_tokens"]


def prefill_round(port: int, inputs: list[str]) -> tuple[float, int]:
    """(seconds, prompt tokens) of one /v1/completions request of every input, one token each; checks them."""
    t0 = time.perf_counter()
    out = post(port, "/v1/completions", {"prompt": inputs, "max_tokens": 1, "temperature": 0})
    seconds = time.perf_counter() - t0
    assert len(out["choices"]) == len(inputs) and out["usage"]["completion_tokens"] == len(inputs)
    return seconds, out["usage"]["prompt_tokens"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    flags = ("--dtype", args.dtype, "--num-threads", str(args.num_threads), "--kv-cache-tokens", "32768")
    inputs = [f"{i} {TEXT}" for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        model = bench_model_dir(args.model, Path(tmp))
        embed_port, gen_port = free_port(), free_port()
        embedder = start_server(model, "--task", "embed", "--http-port", str(embed_port), *flags, timeout_s=600)
        generator = None
        try:
            generator = start_server(model, "--disable-radix-cache", "--http-port", str(gen_port), *flags,
                                     timeout_s=600)
            embed_round(embed_port, inputs[:2])  # warm both
            prefill_round(gen_port, inputs[:2])
            embed_rates, prefill_rates = [], []
            for r in range(args.rounds):
                order = (embed_round, prefill_round) if r % 2 == 0 else (prefill_round, embed_round)
                for run in order:
                    port = embed_port if run is embed_round else gen_port
                    seconds, tokens = run(port, inputs)
                    (embed_rates if run is embed_round else prefill_rates).append(tokens / seconds)
        finally:
            embedder.stop()
            if generator is not None:
                generator.stop()
    info = machine_info()
    ratios = [e / p for e, p in zip(embed_rates, prefill_rates, strict=True)]
    print(f"model {Path(model).name}, {args.dtype}, {args.num_threads} threads; {args.batch} inputs of about "
          f"{tokens // args.batch} tokens a round, {args.rounds} rounds, paths interleaved")
    print(f"CPU {info['cpu']}, {info['num_cores']} cores; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"/v1/embeddings (--task embed):         median {statistics.median(embed_rates):8.0f} prompt tokens/s")
    print(f"/v1/completions max_tokens=1 (prefill): median {statistics.median(prefill_rates):8.0f} prompt tokens/s")
    print(f"embeddings / prefill, paired rounds: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
