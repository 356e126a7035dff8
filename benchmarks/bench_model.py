"""Our forward vs transformers' forward on the same weights, same machine, same run.

    .venv/bin/python benchmarks/bench_model.py [--model DIR] [--threads N] [--repeats R]

Cases: one decode step at batch 1, 8, 32 and 64 with 256 tokens of context per request, and a
512-token prefill. Each line prints both times and ours/transformers (< 1 is faster). The last
line compares batch-1 decode with the memory bound: weight bytes / bandwidth, the bandwidth
measured by a 1 GiB tensor copy timed alternately with the batch-1 decode steps (other
processes' memory traffic then slows both alike). K/V contents do not change the cost of a step, so both
sides get 256 tokens of random context instead of a real prefill (which would take minutes).

Both sides run fp32 in one process started with the model worker's environment
(common/worker_env.py: thread count, OpenMP wait policy, malloc thresholds; the script
re-executes itself with it), so they share threads, allocator and machine state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.forward_batch import ForwardBatch, SamplingArrays  # noqa: E402
from common.worker_env import worker_env  # noqa: E402
from testing.model_fixtures import make_runner  # noqa: E402

DECODE_BATCH_SIZES = (1, 8, 32, 64)
CONTEXT_LEN = 256
PREFILL_LEN = 512
PAGE_SIZE = 16


def log(msg: str) -> None:
    print(f"[bench_model] {msg}", file=sys.stderr, flush=True)


def timed_pair(ours, theirs, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median wall times (ms) of ours() and theirs(), run alternately so that load from other
    processes on the machine falls on both alike."""
    for _ in range(warmup):
        ours(), theirs()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((ours, times[0]), (theirs, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class CopyBandwidth:
    """Bytes moved (read + written) per second by a large tensor copy."""

    def __init__(self, num_bytes: int = 1 << 30):
        self.num_bytes = num_bytes
        self.src = torch.ones(num_bytes // 4, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)

    def copy(self) -> None:
        self.dst.copy_(self.src)

    def gbs(self, copy_ms: float) -> float:
        return 2 * self.num_bytes / (copy_ms / 1e3) / 1e9


def decode_batch(batch_size: int, context_len: int, step_id: int) -> ForwardBatch:
    """batch_size requests, each with context_len tokens cached, decoding one token."""
    pages_per_req = -(-(context_len + 1) // PAGE_SIZE)
    n = batch_size
    return ForwardBatch(
        step_id=step_id,
        input_ids=np.full(n, 42, np.int32),
        cached_lens=np.full(n, context_len, np.int32),
        extend_lens=np.ones(n, np.int32),
        page_ids=np.arange(n * pages_per_req, dtype=np.int32),
        num_pages=np.full(n, pages_per_req, np.int32),
        is_sampled=np.ones(n, bool),
        return_logprob=np.zeros(n, bool),
        sampling=SamplingArrays.greedy(n),
    )


def prefill_batch(prompt_len: int, step_id: int) -> ForwardBatch:
    num_pages = -(-prompt_len // PAGE_SIZE)
    return ForwardBatch(
        step_id=step_id,
        input_ids=np.random.default_rng(0).integers(3, 1000, prompt_len).astype(np.int32),
        cached_lens=np.zeros(1, np.int32),
        extend_lens=np.array([prompt_len], np.int32),
        page_ids=np.arange(num_pages, dtype=np.int32),
        num_pages=np.array([num_pages], np.int32),
        is_sampled=np.ones(1, bool),
        return_logprob=np.zeros(1, bool),
        sampling=SamplingArrays.greedy(1),
    )


class HfSide:
    def __init__(self, model_dir: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.config = self.model.config

    @torch.inference_mode()
    def decode_fn(self, batch_size: int, context_len: int):
        from transformers import DynamicCache

        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch_size, cfg.num_key_value_heads, context_len, head_dim)
        cache = DynamicCache(config=cfg)
        for layer_idx in range(cfg.num_hidden_layers):  # the context, as transformers' cache holds it
            cache.update(torch.randn(shape), torch.randn(shape), layer_idx)
        ids = torch.full((batch_size, 1), 42, dtype=torch.long)
        positions = torch.full((batch_size, 1), context_len, dtype=torch.long)

        @torch.inference_mode()
        def step():
            logits = self.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)  # drop the token just appended (a view), so every step sees context_len tokens
            return logits[:, -1].argmax(-1)

        return step

    def prefill_fn(self, prompt_len: int):
        ids = torch.from_numpy(prefill_batch(prompt_len, 0).input_ids.astype(np.int64))[None]

        @torch.inference_mode()
        def step():
            return self.model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)

        return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the demo model, SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-sizes", default=",".join(map(str, DECODE_BATCH_SIZES)), help="decode cases, comma-separated")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill case")
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the worker's environment (read at process start)
        env = {**os.environ, **worker_env(args.threads, "cpu")}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    model_dir = args.model
    if model_dir is None:
        from launcher.demo_model import demo_model_dir

        model_dir = str(demo_model_dir())
        if not Path(model_dir).is_dir():
            sys.exit(f"demo model not found at {model_dir}: run .venv/bin/zserve-fetch-demo, or pass --model DIR")
    num_threads = int(os.environ["ZSERVE_NUM_THREADS"])
    torch.set_num_threads(num_threads)

    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    pages_per_req = -(-(CONTEXT_LEN + 1) // PAGE_SIZE)
    max_tokens = max(max([1, *batch_sizes]) * pages_per_req * PAGE_SIZE, PREFILL_LEN)
    log(f"loading {model_dir} (ours, then transformers), {num_threads} thread(s)")
    ours = make_runner(model_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE, kv_cache_tokens=max_tokens, num_threads=num_threads)
    hf = HfSide(model_dir)
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.model.parameters())
    for k in ours.kv_pool.k + ours.kv_pool.v:  # random context, as on the transformers side
        k.normal_()

    print(f"model {model_dir}: {weight_bytes / 1e6:.0f} MB of fp32 weights, torch {torch.__version__}, {num_threads} thread(s)")
    print(f"{'case':<22}{'ours_ms':>10}{'hf_ms':>10}{'ratio':>8}")
    num_cases = len(batch_sizes) + (not args.no_prefill) + 1
    for i, batch_size in enumerate(batch_sizes):
        log(f"decode batch {batch_size} ({i + 1}/{num_cases})")
        batch = decode_batch(batch_size, CONTEXT_LEN, step_id=i)
        ours_ms, hf_ms = timed_pair(lambda b=batch: ours.run(b), hf.decode_fn(batch_size, CONTEXT_LEN), args.repeats)
        print(f"{f'decode_bs{batch_size}_ctx{CONTEXT_LEN}':<22}{ours_ms:>10.2f}{hf_ms:>10.2f}{ours_ms / hf_ms:>8.2f}", flush=True)

    if not args.no_prefill:
        log(f"prefill {PREFILL_LEN} tokens ({len(batch_sizes) + 1}/{num_cases})")
        batch = prefill_batch(PREFILL_LEN, step_id=100)
        repeats = max(3, args.repeats // 2)
        ours_ms, hf_ms = timed_pair(lambda: ours.run(batch), hf.prefill_fn(PREFILL_LEN), repeats, warmup=1)
        print(
            f"{f'prefill_{PREFILL_LEN}':<22}{ours_ms:>10.2f}{hf_ms:>10.2f}{ours_ms / hf_ms:>8.2f}"
            f"   ({PREFILL_LEN / ours_ms * 1e3:.0f} vs {PREFILL_LEN / hf_ms * 1e3:.0f} tokens/s)",
            flush=True,
        )

    log(f"memory bound: batch-1 decode vs a 1 GiB tensor copy, alternately ({num_cases}/{num_cases})")
    copier = CopyBandwidth()
    decode_ms, copy_ms = timed_pair(lambda b=decode_batch(1, CONTEXT_LEN, 200): ours.run(b), copier.copy, args.repeats)
    bandwidth = copier.gbs(copy_ms)
    bound_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    print(f"copy bandwidth {bandwidth:.1f} GB/s (read + write), bound = {weight_bytes / 1e6:.0f} MB / bandwidth")
    print(f"decode_bs1_ms {decode_ms:.2f} {bound_ms:.2f}   (ours / bound = {decode_ms / bound_ms:.2f})")


if __name__ == "__main__":
    main()
