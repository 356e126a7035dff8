"""The model worker's decode step alone with LoRA adapters: base rows only against rows mixing three adapters and the
base model, in this process (the worker's environment, one thread by default), and the time of the LoRA layers
alone inside the mixed step.

    .venv/bin/python benchmarks/bench_lora_step.py [--model DIR] [--batch 32] [--rank 16] [--steps 20] [--repeats 3]

One runner with `--enable-lora` and three random PEFT adapters (bench_lora.py's, rank `--rank`, on q/k/v/o and the
MLP); a decode step of `--batch` requests with `--context-len` tokens of context each: `base` (no row has an adapter:
the base path) and `mixed` (row i on adapter i % 4 - 1: a quarter on each adapter, a quarter on the base model),
timed in turn per repeat, as CPU time of this thread (`--threads 1`: the step's own, whatever else the machine
runs). `lora_ms`: the LoRA layers' own time in the mixed step (a timer around every LoRA layer's call, in a separate
pass). A prefill step of `--prefill-reqs` prompts of `--prefill-len` tokens (the served burst's: --max-prefill-tokens
512), its rows on the adapters likewise, is timed the same way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_lora import ADAPTERS, lscpu_model_name  # noqa: E402
from benchmarks.bench_model import PAGE_SIZE, decode_batch  # noqa: E402
from benchmarks.machine_info import load_average  # noqa: E402
from testing.lora_fixtures import build_peft_adapter  # noqa: E402
from testing.server_process import resolve_model_dir  # noqa: E402
from zserve.common.forward_batch import ForwardBatch, SamplingArrays  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context-len", type=int, default=96)
    p.add_argument("--prefill-reqs", type=int, default=8, help="the prefill step: this many new prompts (0: none)")
    p.add_argument("--prefill-len", type=int, default=64, help="tokens of each prefill prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="steps timed per case and repeat (the median is kept)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=Path("bench_lora"))
    return p.parse_args()


def prefill_batch(num_reqs: int, prompt_len: int) -> ForwardBatch:
    """num_reqs new prompts of prompt_len tokens each (the served burst's prefill step: --max-prefill-tokens 512)."""
    pages_per_req = -(-prompt_len // PAGE_SIZE)
    return ForwardBatch(
        step_id=0,
        input_ids=(np.arange(num_reqs * prompt_len) % 900 + 100).astype(np.int32),
        cached_lens=np.zeros(num_reqs, np.int32),
        extend_lens=np.full(num_reqs, prompt_len, np.int32),
        page_ids=np.arange(num_reqs * pages_per_req, dtype=np.int32),
        num_pages=np.full(num_reqs, pages_per_req, np.int32),
        is_sampled=np.ones(num_reqs, bool),
        return_logprob=np.zeros(num_reqs, bool),
        sampling=SamplingArrays.greedy(num_reqs),
    )


def with_adapters(batch: ForwardBatch) -> ForwardBatch:
    """The batch with row i on adapter i % 4 - 1 (-1: the base model)."""
    return msgspec.structs.replace(batch, lora_ids=(np.arange(batch.num_reqs) % 4 - 1).astype(np.int32))


def step_ms(runner, batch, num_steps: int) -> float:
    """The step's median CPU time on this thread (the worker runs it on one thread here): on a shared machine
    other processes' time slices do not count, their cache and memory traffic still does."""
    runner.run(batch)
    times = []
    for _ in range(num_steps):
        t0 = time.thread_time()
        runner.run(batch)
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def lora_layers_ms(runner, batch, num_steps: int) -> float:
    """The LoRA layers' own time per step (a timer around each call), median over the steps."""
    from zserve.model_proc.lora.lora_layer import LoraLayer
    from zserve.model_proc.lora.lora_rows_layer import LoraRowsLayer

    spent = [0.0]

    def before(_module, _inputs):
        spent.append(time.thread_time())

    def after(_module, _inputs, _output):
        spent[0] += time.thread_time() - spent.pop()

    layers = [m for m in runner.model.modules() if isinstance(m, (LoraLayer, LoraRowsLayer))]
    handles = [h for m in layers for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    runner.run(batch)
    per_step = []
    for _ in range(num_steps):
        spent[0] = 0.0
        runner.run(batch)
        per_step.append(spent[0])
    for handle in handles:
        handle.remove()
    return statistics.median(per_step) * 1e3


def main() -> None:
    args = parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # the worker's environment, read at process start
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    from testing.model_fixtures import make_runner

    model = Path(resolve_model_dir(args.model))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    modules = []
    for i, name in enumerate(ADAPTERS):
        path = args.work_dir / f"adapter-{name}-r{args.rank}"
        if not (path / "adapter_config.json").exists():
            build_peft_adapter(path, model, seed=100 + i, rank=args.rank, alpha=2.0 * args.rank, scale=0.05)
        modules.append(f"{name}={path.resolve()}")
    tokens = max(args.batch * (args.context_len + PAGE_SIZE), args.prefill_reqs * (args.prefill_len + PAGE_SIZE))
    runner = make_runner(model, device="cpu", dtype=args.dtype, page_size=PAGE_SIZE, kv_cache_tokens=tokens,
                         num_threads=args.threads, enable_lora=True, lora_modules=",".join(modules),
                         max_lora_rank=args.rank)
    steps = {f"decode, batch {args.batch}": decode_batch(args.batch, args.context_len, step_id=0)}
    if args.prefill_reqs:
        steps[f"prefill, {args.prefill_reqs} x {args.prefill_len} tokens"] = prefill_batch(args.prefill_reqs,
                                                                                             args.prefill_len)
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
    for repeat in range(args.repeats):
        for name, base in steps.items():
            load = load_average()[0]
            cases = {"base": base, "mixed": with_adapters(base)}
            times = {kind: step_ms(runner, cases[kind], args.steps)
                     for kind in (("base", "mixed") if repeat % 2 == 0 else ("mixed", "base"))}
            lora = lora_layers_ms(runner, cases["mixed"], args.steps)
            rows[name].append((times["base"], times["mixed"], lora))
            print(f"repeat {repeat} {name} (load {load:.2f}): base {times['base']:.1f} ms, mixed {times['mixed']:.1f} "
                  f"ms ({times['mixed'] / times['base']:.2f}x), LoRA layers {lora:.1f} ms", flush=True)
    print(f"CPU: {lscpu_model_name()}; rank {args.rank}, {args.threads} thread(s); medians:")
    for name, runs in rows.items():
        base_ms, mixed_ms, lora_ms = (statistics.median(col) for col in zip(*runs, strict=True))
        print(f"  {name}: base {base_ms:.1f} ms, mixed {mixed_ms:.1f} ms, mixed / base = {mixed_ms / base_ms:.2f}x; "
              f"LoRA layers {lora_ms:.1f} ms of the mixed step")

if __name__ == "__main__":
    main()
