"""The CPU paged-attention kernel against the pure-torch path, one attention layer, same run.

    .venv/bin/python benchmarks/bench_attention.py [--dtype bfloat16|float32] [--repeats R] [--quick]

Shapes of the demo model (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64), page size 16,
pages handed out in a shuffled order as a long-running pool would. Cases:
  - decode at batch 1/8/32/64 x context 256/1024 (the per-step attention of one layer);
  - a cached-prefix prefill (256 cached + 256 new) and a mix (63 decodes + that prefill);
  - a new 512-token prompt (torch: SDPA is_causal over the prompt's own K/V; the kernel
    backend sends new prompts through the kernel too, because this case measured it faster).
Each case times `PagedAttention.forward` (K/V write included, metadata built once outside, as
every layer of a step shares it) for both backends alternately, and prints the medians and
kernel/torch (< 1: the kernel is faster). Then, with `--window W` (default 1024; 0 skips), the
kernel on a sliding-window layer against a full-attention one at a context of 4 W: decode at
batch 1/8/64 (ideal ratio 0.25: each token reads W keys, not 4 W), a 4 W-token new prompt and
a chunk of W after 3 W cached tokens (--quick: decode at batch 1 only). With `--model DIR` (or the demo model, when fetched)
it then times whole decode steps (`ModelRunner.run`, 256 tokens of random context per request)
on two runners of that model, one per backend, alternately. Run it on a quiet machine; it prints
the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testing.paged_batches import shuffled_page_batch  # noqa: E402
from zserve.common.forward_batch import ForwardBatch  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402
from zserve.model_proc.kernels.cpu_kernels import load_paged_attention  # noqa: E402
from zserve.model_proc.layers.attention import PagedAttention  # noqa: E402
from zserve.model_proc.layers.attention_metadata import AttentionMetadata  # noqa: E402
from zserve.model_proc.layers.kv_pool import KVPool  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 9, 3, 64, 16


def make_batch(cached_lens: list[int], extend_lens: list[int], num_pages_total: int, seed: int = 0) -> ForwardBatch:
    """A batch whose requests own shuffled pages of a pool of `num_pages_total` pages."""
    return shuffled_page_batch(np.random.default_rng(seed), cached_lens, extend_lens, PAGE_SIZE, num_pages_total)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="decode cases only, context 256 and 1024 at batch 1 and 64")
    parser.add_argument("--model", default=None, help="model for whole decode steps (default: the demo model if fetched)")
    parser.add_argument("--no-model", action="store_true", help="skip the whole-step cases")
    parser.add_argument("--window", type=int, default=1024, help="sliding window for the window cases (0: skip)")
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the model worker's environment
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    torch.set_num_threads(int(os.environ["ZSERVE_NUM_THREADS"]))
    if load_paged_attention() is None:
        sys.exit("the CPU paged-attention kernel did not build here: nothing to compare")
    dtype = getattr(torch, args.dtype)

    cases: list[tuple[str, list[int], list[int]]] = []
    for ctx in (256, 1024):
        for bs in (1, 64) if args.quick else (1, 8, 32, 64):
            cases.append((f"decode_bs{bs}_ctx{ctx}", [ctx] * bs, [1] * bs))
    if not args.quick:
        cases.append(("prefix_256+256", [256], [256]))
        cases.append(("mixed_63dec+prefix", [256] * 63 + [256], [1] * 63 + [256]))
        cases.append(("new_prompt_512", [0], [512]))
    max_tokens = max(sum(c) + sum(e) + PAGE_SIZE * len(c) for _, c, e in cases) + 512
    pool = KVPool(1, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, -(-max_tokens // PAGE_SIZE), dtype, torch.device("cpu"))
    pool.k[0].normal_(), pool.v[0].normal_()
    attn = PagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, layer_idx=0)

    print(f"torch {torch.__version__}, {args.dtype}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<24}{'kernel_ms':>10}{'torch_ms':>10}{'ratio':>8}")
    with torch.inference_mode():
        for name, cached, extend in cases:
            batch = make_batch(cached, extend, pool.num_pages)
            metas = [AttentionMetadata.build(batch, pool, dtype, backend=b) for b in ("cpu_kernel", "torch")]
            T = batch.num_tokens
            q = torch.randn(T, NUM_HEADS, HEAD_DIM, dtype=dtype)
            k, v = (torch.randn(T, NUM_KV_HEADS, HEAD_DIM, dtype=dtype) for _ in range(2))
            kernel_ms, torch_ms = timed_pair(*(functools.partial(attn, q, k, v, m) for m in metas), args.repeats)
            print(f"{name:<24}{kernel_ms:>10.3f}{torch_ms:>10.3f}{kernel_ms / torch_ms:>8.2f}", flush=True)
    if args.window > 0:
        window_cases(args.window, dtype, args.quick, args.repeats)
    model_dir = None if args.no_model else args.model or _demo_model_dir()
    if model_dir is not None:
        model_steps(model_dir, args.dtype, (1, 8) if args.quick else (1, 8, 32, 64), args.repeats)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def window_cases(window: int, dtype: torch.dtype, quick: bool, repeats: int) -> None:
    """The kernel with a sliding window against full attention, context 4 x window, same K/V."""
    context_len = 4 * window
    cases: list[tuple[str, list[int], list[int]]] = [
        (f"decode_bs{bs}_ctx{context_len}", [context_len] * bs, [1] * bs) for bs in ((1,) if quick else (1, 8, 64))
    ]
    if not quick:
        cases.append((f"new_prompt_{context_len}", [0], [context_len]))
        cases.append((f"chunk_{window}_after_{3 * window}", [3 * window], [window]))
    max_tokens = max(sum(c) + sum(e) + PAGE_SIZE * len(c) for _, c, e in cases)
    pool = KVPool(1, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, -(-max_tokens // PAGE_SIZE), dtype, torch.device("cpu"))
    pool.k[0].normal_(), pool.v[0].normal_()
    layers = [
        PagedAttention(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, layer_idx=0, sliding_window=w) for w in (window, 0)
    ]
    print(f"sliding window {window} vs full attention, CPU kernel, load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<24}{'window_ms':>10}{'full_ms':>10}{'ratio':>8}")
    with torch.inference_mode():
        for name, cached, extend in cases:
            batch = make_batch(cached, extend, pool.num_pages)
            meta = AttentionMetadata.build(batch, pool, dtype, backend="cpu_kernel")
            T = batch.num_tokens
            q = torch.randn(T, NUM_HEADS, HEAD_DIM, dtype=dtype)
            k, v = (torch.randn(T, NUM_KV_HEADS, HEAD_DIM, dtype=dtype) for _ in range(2))
            window_ms, full_ms = timed_pair(*(functools.partial(layer, q, k, v, meta) for layer in layers), repeats)
            print(f"{name:<24}{window_ms:>10.3f}{full_ms:>10.3f}{window_ms / full_ms:>8.2f}", flush=True)


def _demo_model_dir() -> str | None:
    from zserve.launcher.demo_model import demo_model_dir

    return str(demo_model_dir()) if Path(demo_model_dir()).is_dir() else None


def model_steps(model_dir: str, dtype: str, batch_sizes, repeats: int, context_len: int = 256) -> None:
    """Whole decode steps on one runner per backend (--attention-backend, the config's attention_backend)."""
    from dataclasses import replace

    from testing.model_fixtures import runner_of
    from zserve.common.server_config import ServerConfig

    pages_per_req = -(-(context_len + 1) // PAGE_SIZE)
    runners = []
    for choice in ("kernel", "torch"):
        cfg = replace(ServerConfig(model=model_dir), attention_backend=choice, device="cpu", dtype=dtype, page_size=PAGE_SIZE,
                      kv_cache_tokens=max(batch_sizes) * pages_per_req * PAGE_SIZE, num_threads=torch.get_num_threads())  # fmt: skip
        runner = runner_of(cfg, show_progress=False)
        for cache in runner.kv_pool.k + runner.kv_pool.v:
            cache.normal_()
        runners.append(runner)
    print(f"whole decode steps, {Path(model_dir).name}, context {context_len}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<24}{'kernel_ms':>10}{'torch_ms':>10}{'ratio':>8}")
    for bs in batch_sizes:
        batch = make_batch([context_len] * bs, [1] * bs, runners[0].kv_pool.num_pages, seed=bs)
        batch.input_ids[:] = 42
        kernel_ms, torch_ms = timed_pair(*(functools.partial(r.run, batch) for r in runners), max(3, repeats // 2))
        print(f"{f'step_bs{bs}_ctx{context_len}':<24}{kernel_ms:>10.2f}{torch_ms:>10.2f}{kernel_ms / torch_ms:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
