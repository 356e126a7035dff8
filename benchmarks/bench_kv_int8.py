"""The quantized KV caches (--kv-cache-dtype int8, fp8_e4m3, fp8_e5m2) against the 16-bit one: decode attention
time at long context, and quality on the demo model.

    .venv/bin/python benchmarks/bench_kv_int8.py [--context 4096] [--repeats R] [--new-tokens N] [--no-model]
        [--kv-cache-dtypes int8,fp8_e4m3,fp8_e5m2]

1. Decode attention, one layer of the demo model's shape (9 query heads, 3 KV heads, head_dim 64, page size 16,
   pages in a shuffled order), bf16 queries, batch 1/8/32 at `--context` tokens each: the CPU kernel over a bf16
   cache (zserve::paged_attention) and over each quantized one (paged_attention_int8; paged_attention over fp8
   caches), the call alone (the metadata built once, as a step's layers share it), timed in turn; medians and
   each cache's time over bf16's (< 1: faster).
2. On the demo model (SmolLM2-135M-Instruct, `zserve-fetch-demo`; skipped when it is not fetched) in bf16, a few chat
   prompts, `--new-tokens` tokens each: the 16-bit cache's greedy tokens are fed to the runners (teacher forcing):
   bf16 with each quantized cache, bf16 with the 16-bit cache and fp32; at every position the next-token
   distributions give KL(bf16 || quantized), the quantized cache's cost, beside KL(fp32 || bf16), the rounding floor
   bf16 itself sets, and the share of positions whose argmax agrees. Then free-running greedy decoding with each
   cache: how many tokens agree before the first difference.
Prints the CPU model (lscpu's name) and the load average: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_info  # noqa: E402
from testing.paged_batches import shuffled_page_batch  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402
from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels  # noqa: E402
from zserve.model_proc.layers.attention import PagedAttention  # noqa: E402
from zserve.model_proc.layers.attention_metadata import AttentionMetadata  # noqa: E402
from zserve.model_proc.layers.kv_pool import KVPool  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 9, 3, 64, 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU cache does.",
             "List three prime numbers and explain why they are prime."]


def timed_in_turn(calls: list, repeats: int) -> list[float]:
    """Median ms of each call, run in turn so other load falls on all alike."""
    for fn in calls:
        fn()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for fn, out in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def decode_attention(context_len: int, repeats: int, kv_dtypes: list[str]) -> None:
    batch_sizes = (1, 8, 32)
    num_pages = max(batch_sizes) * -(-(context_len + 1) // PAGE_SIZE) + 8
    names = ["auto", *kv_dtypes]
    pools = {name: KVPool(1, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, num_pages, torch.bfloat16, torch.device("cpu"), name)
             for name in names}
    k, v = (torch.randn(num_pages * PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    for pool in pools.values():  # the same rows, each cache's writer
        pool.write(0, torch.arange(pool.num_slots), k, v)
    attn = PagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, layer_idx=0)
    print(f"decode attention, one layer ({NUM_HEADS} q heads, {NUM_KV_HEADS} kv heads, d {HEAD_DIM}), bf16 q, "
          f"context {context_len}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<24}{'bf16_ms':>10}" + "".join(f"{n + '_ms':>15}{'/bf16':>7}" for n in kv_dtypes)
          + "".join(f"{n + '_MB':>15}" for n in names))
    with torch.inference_mode():
        for bs in batch_sizes:
            batch = shuffled_page_batch(np.random.default_rng(bs), [context_len] * bs, [1] * bs, PAGE_SIZE, num_pages)
            q = torch.randn(bs, NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
            calls = []
            for name in names:
                pool = pools[name]
                meta = AttentionMetadata.build(batch, pool, torch.bfloat16, backend="cpu_kernel")
                calls.append(functools.partial(attn._kernel, q, pool.k[0], pool.v[0], meta))
            bf16_ms, *ms = timed_in_turn(calls, repeats)
            read_mb = [bs * (context_len + 1) * pools[n].num_bytes / pools[n].num_slots / 1e6 for n in names]
            print(f"{f'decode_bs{bs}_ctx{context_len}':<24}{bf16_ms:>10.3f}"
                  + "".join(f"{t:>15.3f}{t / bf16_ms:>7.2f}" for t in ms) + "".join(f"{mb:>15.1f}" for mb in read_mb),
                  flush=True)


def demo_quality(model_dir: str, new_tokens: int, kv_dtypes: list[str]) -> None:
    from transformers import AutoTokenizer

    from testing.model_fixtures import GreedyDriver, runner_of
    from zserve.common.server_config import ServerConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in QUESTIONS]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    base = ServerConfig(model=model_dir, device="cpu", page_size=PAGE_SIZE, kv_cache_tokens=4096,
                        num_threads=torch.get_num_threads())
    configs = [*((kv, "bfloat16", kv) for kv in kv_dtypes), ("bf16", "bfloat16", "auto"), ("fp32", "float32", "auto")]
    runners = {name: runner_of(replace(base, dtype=dtype, kv_cache_dtype=kv), show_progress=False)
               for name, dtype, kv in configs}
    free: dict[str, list[list[int]]] = {}
    for name in ("bf16", *kv_dtypes):
        driver = GreedyDriver(runners[name])
        free[name] = driver.generate([driver.add(p, new_tokens) for p in prompts])
    kl: dict[str, list[float]] = {name: [] for name in (*kv_dtypes, "fp32")}  # against bf16 with the 16-bit cache
    agree: dict[str, list[bool]] = {name: [] for name in kl}
    for prompt, reference in zip(prompts, free["bf16"], strict=True):
        logprobs = {}
        for name, runner in runners.items():  # teacher forcing: the bf16 cache's tokens, one position at a time
            driver = GreedyDriver(runner)
            seq = driver.add(prompt, new_tokens)
            rows = []
            for token in [None, *reference[:-1]]:
                if token is not None:
                    seq.tokens.append(token)
                batch = driver.build_batch([seq])
                rows.append(runner.last_logits(batch)[0].float().log_softmax(-1))
                seq.cached_len += int(batch.extend_lens[0])
            logprobs[name] = torch.stack(rows)
        for name in kl:  # KL(p || q) per position; the floor is KL(fp32 || bf16)
            p, q = (logprobs["fp32"], logprobs["bf16"]) if name == "fp32" else (logprobs["bf16"], logprobs[name])
            kl[name] += (p.exp() * (p - q)).sum(-1).tolist()
            agree[name] += (logprobs[name].argmax(-1) == logprobs["bf16"].argmax(-1)).tolist()
    print(f"demo model {Path(model_dir).name}, bf16, {len(prompts)} chat prompts x {new_tokens} tokens, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"  teacher-forced on the bf16 cache's greedy tokens ({len(kl['fp32'])} positions):")
    for name in kl:
        what = "rounding floor, fp32 vs bf16 (16-bit cache)" if name == "fp32" else f"{name} cache vs bf16 cache"
        print(f"    {what}: mean KL {statistics.mean(kl[name]):.2e} nats (max {max(kl[name]):.2e}), "
              f"argmax agreement {100 * sum(agree[name]) / len(agree[name]):.1f}%")
    for name in kv_dtypes:
        pairs = [(a, b) for x, y in zip(free["bf16"], free[name], strict=True) for a, b in zip(x, y, strict=True)]
        first_diff = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
                      for x, y in zip(free["bf16"], free[name], strict=True)]
        print(f"  free-running greedy, {name} vs bf16 cache: tokens equal before the first difference {first_diff} "
              f"of {new_tokens}; positions equal {100 * sum(a == b for a, b in pairs) / len(pairs):.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--model", default=None, help="model for the quality part (default: the demo model if fetched)")
    parser.add_argument("--no-model", action="store_true", help="skip the quality part")
    parser.add_argument("--kv-cache-dtypes", default="int8,fp8_e4m3,fp8_e5m2", help="the caches set beside bf16's")
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the model worker's environment
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    torch.set_num_threads(int(os.environ["ZSERVE_NUM_THREADS"]))
    if not load_cpu_kernels():
        sys.exit("the CPU kernels did not build here: nothing to compare")
    info = machine_info()
    print(f"CPU: {info['cpu']} ({info['cpu_isa']}), {info['num_cores']} cores, torch {torch.__version__}")
    kv_dtypes = args.kv_cache_dtypes.split(",")
    decode_attention(args.context, args.repeats, kv_dtypes)
    model_dir = None if args.no_model else args.model or _demo_model_dir()
    if model_dir is not None:
        demo_quality(model_dir, args.new_tokens, kv_dtypes)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def _demo_model_dir() -> str | None:
    from zserve.launcher.demo_model import demo_model_dir, missing_files

    directory = demo_model_dir()
    return None if missing_files(directory) else str(directory)


if __name__ == "__main__":
    main()
