"""The MoE decode step against dense models of the same total and of the same active parameters.

    .venv/bin/python benchmarks/bench_moe.py [--hidden 1024] [--experts 8] [--top-k 2] [--layers 4]
                                             [--batch-sizes 1,8,64] [--dtype bfloat16] [--repeats 7]

Three tiny random checkpoints of a realistic shape, written by transformers (testing/model_fixtures.py):

    moe            Qwen3-MoE: every layer `--experts` experts of width `--expert-width`, top `--top-k`
    dense_total    Qwen3, MLP width experts x expert-width: the same weights in all (a step reads them all)
    dense_active   Qwen3, MLP width top-k x expert-width: the weights one token multiplies by

For each decode batch (256 tokens of random context per request, as bench_model.py) the three
steps are timed in turn (median ms), and one MoE layer's routed experts alone (FusedExperts on
the router's choice for that batch): the bytes of the experts hit, over that time, is the expert
GEMMs' weight-read rate, printed against the copy bandwidth measured in the same loop (the bound
of a weight-streaming GEMM). The vocabulary is small (600), so the LM head does not hide the MLPs.

Each time is printed twice: wall (ms) and this process's CPU time (cpu_ms, `time.process_time`).
On a machine other processes load, the wall time of a step holds their time slices too; with
`--threads 1` the CPU time is the step's own cost (OpenMP spin-waits make it meaningless above one thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model import CONTEXT_LEN, PAGE_SIZE, CopyBandwidth, decode_batch  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from testing.model_fixtures import make_runner, make_tiny_checkpoint  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402
from zserve.model_proc.compute_dtype import DTYPES  # noqa: E402
from zserve.model_proc.layers.gemm import gemm_weight_bytes  # noqa: E402
from zserve.model_proc.layers.sparse_moe import SparseMoeBlock  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_moe] {msg}", file=sys.stderr, flush=True)


def write_models(root: Path, args) -> dict[str, Path]:
    shape = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                 num_key_value_heads=max(1, args.hidden // 256), head_dim=64, max_position_embeddings=4096)
    width = args.expert_width
    return {
        "moe": make_tiny_checkpoint(root / "moe", "qwen3_moe", stored_dtype="bfloat16", **shape,
                                    num_experts=args.experts, num_experts_per_tok=args.top_k,
                                    moe_intermediate_size=width, mlp_only_layers=[]),
        "dense_total": make_tiny_checkpoint(root / "total", "qwen3", stored_dtype="bfloat16", **shape,
                                            intermediate_size=args.experts * width),
        "dense_active": make_tiny_checkpoint(root / "active", "qwen3", stored_dtype="bfloat16", **shape,
                                             intermediate_size=args.top_k * width),
    }


def experts_case(runner, batch_size: int):
    """One MoE layer's routed experts on `batch_size` rows as its router sends them: (fn, bytes of the experts hit)."""
    block = next(m for m in runner.model.modules() if isinstance(m, SparseMoeBlock))
    x = torch.randn(batch_size, runner.config.hidden_size).to(runner.dtype)
    expert_ids, weights = block.gate(x)
    hit = torch.unique(expert_ids).tolist()
    num_bytes = sum(gemm_weight_bytes(block.experts.experts[e], runner.dtype) for e in hit)
    return (lambda: block.experts(x, expert_ids, weights)), num_bytes, len(hit)


def timed_alternately(fns, repeats: int, warmup: int = 2) -> list[tuple[float, float]]:
    """(median wall ms, median CPU ms) of each of fns(), run in turn so that load falls on all alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, wall, cpu in zip(fns, walls, cpus, strict=True):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--expert-width", type=int, default=1024, help="each expert's intermediate size")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = the worker's default)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # run under the worker's environment (read at process start)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    num_threads = int(os.environ["ZSERVE_NUM_THREADS"])
    torch.set_num_threads(num_threads)
    dtype = DTYPES[args.dtype]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    info = machine_info()
    print(f"{info['cpu']}, {num_threads} thread(s), torch {torch.__version__}, load average {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        log("writing the three checkpoints")
        model_dirs = write_models(Path(tmp), args)
        max_tokens = max(batch_sizes) * (-(-(CONTEXT_LEN + 1) // PAGE_SIZE)) * PAGE_SIZE
        runners = {name: make_runner(d, device="cpu", dtype=dtype, page_size=PAGE_SIZE, kv_cache_tokens=max_tokens,
                                     num_threads=num_threads) for name, d in model_dirs.items()}
    for runner in runners.values():
        for cache in runner.kv_pool.k + runner.kv_pool.v:
            cache.normal_()
    moe = runners["moe"]
    print(f"{args.dtype}, {moe.gemm_backend} GEMM; hidden {args.hidden}, {args.layers} layers, {args.experts} experts "
          f"of width {args.expert_width}, top-{args.top_k}")
    for name, runner in runners.items():
        cfg = runner.config
        print(f"  {name:<13} {cfg.num_params / 1e6:7.1f} M params, {cfg.num_active_params / 1e6:6.1f} M active, "
              f"{gemm_weight_bytes(runner.model, dtype) / 1e6:6.0f} MB of GEMM weights")
    copier = CopyBandwidth()
    print(f"{'batch':>5}{'':>6}{'moe_ms':>9}{'total_ms':>10}{'active_ms':>10}{'moe/total':>10}{'moe/active':>11}"
          f"{'experts_hit':>12}{'expert_ms':>10}{'expert_GB/s':>12}{'copy_GB/s':>10}")
    for step_id, batch_size in enumerate(batch_sizes):
        log(f"decode batch {batch_size}")
        batch = decode_batch(batch_size, CONTEXT_LEN, step_id)
        experts_fn, expert_bytes, num_hit = experts_case(moe, batch_size)
        fns = [lambda r=r, b=batch: r.run(b) for r in runners.values()] + [experts_fn, copier.copy]
        timings = timed_alternately(fns, args.repeats)
        for clock, i in (("wall", 0), ("cpu", 1)):
            moe_ms, total_ms, active_ms, expert_ms, copy_ms = (t[i] for t in timings)
            rate = expert_bytes / (expert_ms / 1e3) / 1e9
            print(f"{batch_size:>5}{clock:>6}{moe_ms:>9.2f}{total_ms:>10.2f}{active_ms:>10.2f}{moe_ms / total_ms:>10.2f}"
                  f"{moe_ms / active_ms:>11.2f}{num_hit:>12}{expert_ms:>10.3f}{rate:>12.1f}{copier.gbs(copy_ms):>10.1f}",
                  flush=True)
    print(f"load average at the end {load_average()}")


if __name__ == "__main__":
    main()
