"""Whole model steps on each CPU compute path, same process, same run: what each layer of the
fast path buys.

    .venv/bin/python benchmarks/bench_cpu_paths.py [--dtype bfloat16|float32] [--repeats R] [--model DIR]

Variants (one ModelRunner each, built under these settings; model_proc/layers/gemm.py and
model_proc/kernels/ say what they are):
  1. torch:   ZSERVE_GEMM=torch, ZSERVE_FUSED_OPS=off  (torch.mm on [in, out] weights, torch's ops)
  2. onednn:  ZSERVE_GEMM=onednn, ZSERVE_FUSED_OPS=off (oneDNN on prepacked weights)
  3. kernel:  ZSERVE_GEMM=auto, ZSERVE_FUSED_OPS=off   (our bf16 GEMM where it builds, split with oneDNN by rows
                                                        where oneDNN has native bf16; fp32: oneDNN)
  4. default: ZSERVE_GEMM=auto, ZSERVE_FUSED_OPS=auto  (3 + fused norms, activation, rotary/K-V write)
  5. bf16_alone: ZSERVE_GEMM=zserve_bf16, fused ops     (4 with zserve's bf16 GEMM for every row count,
                                                        where auto splits the rows with oneDNN)
(A variant that comes out the same as an earlier one, e.g. 3 in fp32, is skipped.) Cases: one
decode step at batch 1, 8 and 64 with 256 tokens of random context each, and a 512-token prompt.
Steps run variant after variant in turn; medians are printed with each variant's ratio to the
first (< 1: faster). All variants use the CPU attention kernel where it builds. The process
runs under the model worker's environment (common/worker_env.py), as bench_model.py does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model import decode_batch, prefill_batch  # noqa: E402
from benchmarks.machine_info import load_average  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402

VARIANTS = {
    "torch": {"ZSERVE_GEMM": "torch", "ZSERVE_FUSED_OPS": "off"},
    "onednn": {"ZSERVE_GEMM": "onednn", "ZSERVE_FUSED_OPS": "off"},
    "kernel": {"ZSERVE_GEMM": "auto", "ZSERVE_FUSED_OPS": "off"},
    "default": {"ZSERVE_GEMM": "auto", "ZSERVE_FUSED_OPS": "auto"},
    "bf16_alone": {"ZSERVE_GEMM": "zserve_bf16", "ZSERVE_FUSED_OPS": "auto"},
}
CONTEXT_LEN, PAGE_SIZE, PREFILL_LEN = 256, 16, 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the demo model)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch-sizes", default="1,8,64")
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the worker's environment (read at process start)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(0, "cpu")})
    import torch

    from testing.model_fixtures import make_runner
    from testing.server_process import resolve_model_dir

    model_dir = resolve_model_dir(args.model or "")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    max_tokens = max(max(batch_sizes) * (-(-(CONTEXT_LEN + 1) // PAGE_SIZE)) * PAGE_SIZE, PREFILL_LEN)
    runners, seen = {}, set()
    for name, env in VARIANTS.items():
        os.environ.update(env)
        print(f"[bench_cpu_paths] loading variant {name} ({env})", file=sys.stderr, flush=True)
        runner = make_runner(model_dir, device="cpu", dtype=args.dtype, page_size=PAGE_SIZE, kv_cache_tokens=max_tokens)
        fused = any(getattr(m, "fused", False) for m in runner.model.modules())
        if (runner.gemm_backend, fused) in seen:
            print(f"[bench_cpu_paths] {name} is the same as an earlier variant here ({runner.gemm_backend}, fused={fused}): skipped", file=sys.stderr)
            continue
        seen.add((runner.gemm_backend, fused))
        for cache in runner.kv_pool.k + runner.kv_pool.v:
            cache.normal_()
        runners[f"{name} ({runner.gemm_backend})"] = runner
    for env in VARIANTS.values():
        for key in env:
            os.environ.pop(key, None)

    print(f"model {model_dir}, {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average {load_average()}")
    names = list(runners)
    print(f"{'case':<16}" + "".join(f"{n:>24}" for n in names) + "   ratios to the first")
    cases = [(f"decode_bs{b}", decode_batch(b, CONTEXT_LEN, i)) for i, b in enumerate(batch_sizes)] + [
        (f"prefill_{PREFILL_LEN}", prefill_batch(PREFILL_LEN, 99, next(iter(runners.values())).config.vocab_size))
    ]
    for case, batch in cases:
        times: dict[str, list[float]] = {n: [] for n in names}
        for runner in runners.values():  # warm-up
            runner.run(batch)
        repeats = args.repeats if not case.startswith("prefill") else max(3, args.repeats // 2)
        for _ in range(repeats):
            for name, runner in runners.items():
                t0 = time.perf_counter()
                runner.run(batch)
                times[name].append((time.perf_counter() - t0) * 1e3)
        med = [statistics.median(times[n]) for n in names]
        print(f"{case:<16}" + "".join(f"{m:>21.1f} ms" for m in med) + "   " + " ".join(f"{m / med[0]:.2f}" for m in med), flush=True)
    print(f"load average at the end {load_average()}")


if __name__ == "__main__":
    main()
