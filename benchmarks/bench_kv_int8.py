"""The int8 KV cache (--kv-cache-dtype int8) against the 16-bit one: decode attention time at long context, and
quality on the demo model.

    .venv/bin/python benchmarks/bench_kv_int8.py [--context 4096] [--repeats R] [--new-tokens N] [--no-model]

1. Decode attention, one layer of the demo model's shape (9 query heads, 3 KV heads, head_dim 64, page size 16,
   pages in a shuffled order), bf16 queries, batch 1/8/32 at `--context` tokens each: the CPU kernel over a bf16
   cache (zserve::paged_attention) and over an int8 one (paged_attention_int8), the call alone (the metadata built
   once, as a step's layers share it), timed alternately; medians and int8/bf16 (< 1: int8 faster).
2. On the demo model (SmolLM2-135M-Instruct, `zserve-fetch-demo`; skipped when it is not fetched) in bf16, a few chat
   prompts, `--new-tokens` tokens each: the 16-bit cache's greedy tokens are fed to three runners (teacher forcing):
   bf16 with the int8 cache, bf16 with the 16-bit cache and fp32; at every position the next-token distributions
   give KL(bf16 || int8), the int8 cache's cost, beside KL(fp32 || bf16), the rounding floor bf16 itself sets, and
   the share of positions whose argmax agrees. Then free-running greedy decoding with each cache: how many tokens
   agree before the first difference.
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
from zserve.model_proc.layers.kv_int8 import quantize_rows  # noqa: E402
from zserve.model_proc.layers.kv_pool import KVPool  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 9, 3, 64, 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU cache does.",
             "List three prime numbers and explain why they are prime."]


def timed_pair(a, b, repeats: int) -> tuple[float, float]:
    """Median ms of a() and b(), run alternately so other load falls on both alike."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def decode_attention(context_len: int, repeats: int) -> None:
    batch_sizes = (1, 8, 32)
    num_pages = max(batch_sizes) * -(-(context_len + 1) // PAGE_SIZE) + 8
    pools = {name: KVPool(1, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, num_pages, torch.bfloat16, torch.device("cpu"), name)
             for name in ("auto", "int8")}
    k, v = (torch.randn(NUM_KV_HEADS, num_pages * PAGE_SIZE, HEAD_DIM) for _ in range(2))
    pools["auto"].k[0].copy_(k), pools["auto"].v[0].copy_(v)
    for x, cache, scales in ((k, pools["int8"].k[0], pools["int8"].k_scales[0]), (v, pools["int8"].v[0], pools["int8"].v_scales[0])):
        q8, s8 = quantize_rows(x)
        cache.copy_(q8), scales.copy_(s8)
    attn = PagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, layer_idx=0)
    print(f"decode attention, one layer ({NUM_HEADS} q heads, {NUM_KV_HEADS} kv heads, d {HEAD_DIM}), bf16 q, "
          f"context {context_len}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<24}{'int8_ms':>10}{'bf16_ms':>10}{'ratio':>8}{'int8_MB':>9}{'bf16_MB':>9}")
    with torch.inference_mode():
        for bs in batch_sizes:
            batch = shuffled_page_batch(np.random.default_rng(bs), [context_len] * bs, [1] * bs, PAGE_SIZE, num_pages)
            q = torch.randn(bs, NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
            calls = []
            for name in ("int8", "auto"):
                pool = pools[name]
                meta = AttentionMetadata.build(batch, pool, torch.bfloat16, backend="cpu_kernel")
                calls.append(functools.partial(attn._kernel, q, pool.k[0], pool.v[0], meta))
            int8_ms, bf16_ms = timed_pair(*calls, repeats)
            read_mb = {n: bs * (context_len + 1) * pools[n].num_bytes / pools[n].num_slots / 1e6 for n in pools}
            print(f"{f'decode_bs{bs}_ctx{context_len}':<24}{int8_ms:>10.3f}{bf16_ms:>10.3f}{int8_ms / bf16_ms:>8.2f}"
                  f"{read_mb['int8']:>9.1f}{read_mb['auto']:>9.1f}", flush=True)


def demo_quality(model_dir: str, new_tokens: int) -> None:
    from transformers import AutoTokenizer

    from testing.model_fixtures import GreedyDriver, runner_of
    from zserve.common.server_config import ServerConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in QUESTIONS]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    base = ServerConfig(model=model_dir, device="cpu", page_size=PAGE_SIZE, kv_cache_tokens=4096,
                        num_threads=torch.get_num_threads())
    runners = {name: runner_of(replace(base, dtype=dtype, kv_cache_dtype=kv), show_progress=False)
               for name, dtype, kv in (("int8", "bfloat16", "int8"), ("bf16", "bfloat16", "auto"), ("fp32", "float32", "auto"))}
    free: dict[str, list[list[int]]] = {}
    for name in ("bf16", "int8"):
        driver = GreedyDriver(runners[name])
        free[name] = driver.generate([driver.add(p, new_tokens) for p in prompts])
    kl_int8, kl_floor, agree_int8, agree_fp32 = [], [], [], []
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
        kl = lambda p, q: (p.exp() * (p - q)).sum(-1)  # noqa: E731  KL(p || q) per position
        kl_int8 += kl(logprobs["bf16"], logprobs["int8"]).tolist()
        kl_floor += kl(logprobs["fp32"], logprobs["bf16"]).tolist()
        agree_int8 += (logprobs["int8"].argmax(-1) == logprobs["bf16"].argmax(-1)).tolist()
        agree_fp32 += (logprobs["fp32"].argmax(-1) == logprobs["bf16"].argmax(-1)).tolist()
    first_diff = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
                  for x, y in zip(free["bf16"], free["int8"], strict=True)]
    print(f"demo model {Path(model_dir).name}, bf16, {len(prompts)} chat prompts x {new_tokens} tokens, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"  teacher-forced on the bf16 cache's greedy tokens ({len(kl_int8)} positions):")
    print(f"    int8 cache vs bf16 cache: mean KL {statistics.mean(kl_int8):.2e} nats (max {max(kl_int8):.2e}), "
          f"argmax agreement {100 * sum(agree_int8) / len(agree_int8):.1f}%")
    print(f"    rounding floor, fp32 vs bf16 (16-bit cache): mean KL {statistics.mean(kl_floor):.2e} nats "
          f"(max {max(kl_floor):.2e}), argmax agreement {100 * sum(agree_fp32) / len(agree_fp32):.1f}%")
    print(f"  free-running greedy, int8 vs bf16 cache: tokens equal before the first difference {first_diff} "
          f"of {new_tokens}; positions equal {100 * sum(a == b for x, y in zip(free['bf16'], free['int8'], strict=True) for a, b in zip(x, y, strict=True)) / (len(prompts) * new_tokens):.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--model", default=None, help="model for the quality part (default: the demo model if fetched)")
    parser.add_argument("--no-model", action="store_true", help="skip the quality part")
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the model worker's environment
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    torch.set_num_threads(int(os.environ["ZSERVE_NUM_THREADS"]))
    if not load_cpu_kernels():
        sys.exit("the CPU kernels did not build here: nothing to compare")
    info = machine_info()
    print(f"CPU: {info['cpu']} ({info['cpu_isa']}), {info['num_cores']} cores, torch {torch.__version__}")
    decode_attention(args.context, args.repeats)
    model_dir = None if args.no_model else args.model or _demo_model_dir()
    if model_dir is not None:
        demo_quality(model_dir, args.new_tokens)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def _demo_model_dir() -> str | None:
    from zserve.launcher.demo_model import demo_model_dir, missing_files

    directory = demo_model_dir()
    return None if missing_files(directory) else str(directory)


if __name__ == "__main__":
    main()
