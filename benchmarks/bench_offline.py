"""Offline throughput: zserve against transformers' `generate`, same model, same machine, one run.

    # the reported case: 256 requests, inputs 32-512 tokens, outputs 32-256 tokens
    .venv/bin/python benchmarks/bench_offline.py --num-requests 256 \\
        --input-len 512 --min-input-len 32 --output-len 256 --min-output-len 32

N requests of random token ids with random input and output lengths, greedy, EOS ignored (every
request generates exactly its output length on both sides).

1. zserve: `zserve.Engine` starts the server (--server-args), all N requests are sent at once
   through the async client; throughput = output tokens / (first send to last finish).
2. transformers: static batching (benchmarks/hf_static_batcher.py). Its best batch size is
   found first: every size of --hf-batch-sizes runs the first --hf-search-requests requests,
   and the fastest (output tokens/s) runs all N. --hf-batch-size skips the search.

Both run the same weights dtype (--dtype, default float32, the oracle's; bfloat16 compares the 16-bit paths:
zserve's widening kernels against transformers' torch.mm). Prints both throughputs and zserve / transformers;
writes JSON (--output-json). The server is stopped before transformers runs, so the two never share the CPU.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hf_static_batcher import HfRun, HfStaticBatcher  # noqa: E402
from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.metrics import RunMetrics  # noqa: E402
from benchmarks.workloads import LengthRange, random_workload, sampleable_token_ids  # noqa: E402
from testing.server_process import resolve_model_dir  # noqa: E402
from zserve import Engine  # noqa: E402

DEFAULT_SERVER_ARGS = "--log-level warning"


def log(msg: str) -> None:
    print(f"[bench_offline] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the SmolLM2-135M-Instruct demo model)")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512, help="longest prompt (tokens)")
    p.add_argument("--output-len", type=int, default=256, help="longest output (tokens)")
    p.add_argument("--range-ratio", type=float, default=1.0,
                   help="SGLang's convention: lengths uniform in [max(1, int(LEN * ratio)), LEN]; 1.0 = fixed lengths")
    p.add_argument("--min-input-len", type=int, default=None, help="shortest prompt, overriding --range-ratio")
    p.add_argument("--min-output-len", type=int, default=None, help="shortest output, overriding --range-ratio")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype of both zserve (--dtype) and transformers (default: %(default)s)")
    p.add_argument("--server-args", default=DEFAULT_SERVER_ARGS, help="flags for the zserve server (default: %(default)r)")
    p.add_argument("--hf-batch-sizes", default="8,16,32,64", help="batch sizes tried for transformers")
    p.add_argument("--hf-search-requests", type=int, default=64, help="requests each tried batch size runs")
    p.add_argument("--hf-batch-size", type=int, default=None, help="skip the search and use this batch size")
    p.add_argument("--hf-threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads for transformers (default: every core, %(default)s; the server is stopped by then)")
    p.add_argument("--skip-hf", action="store_true", help="zserve only (no ratio)")
    p.add_argument("--output-json", type=Path, default=Path("bench_offline.json"))
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def run_zserve(args: argparse.Namespace, model_dir: str, requests) -> tuple[RunMetrics, dict]:
    flags = [*shlex.split(args.server_args), "--dtype", args.dtype]
    log(f"zserve: launch_server {shlex.join(flags)}; load average {load_average()}")
    started_s = time.perf_counter()
    with Engine(model_dir, server_args=flags) as engine:  # the offline API: the server in a `with` block
        startup_s = time.perf_counter() - started_s
        log(f"zserve: ready in {startup_s:.1f}s; sending {len(requests)} requests at once")
        options = LoadOptions(ignore_eos=True, num_warmup_requests=2, progress_desc="zserve", show_progress=not args.no_progress)
        load = drive(engine.address, requests, [0.0] * len(requests), options)
    metrics = RunMetrics.of_records(load.records, load.start_s)
    expected = sum(r.max_tokens for r in requests)
    if metrics.num_failed or metrics.num_output_tokens != expected:
        raise RuntimeError(f"zserve: {metrics.num_failed} failed requests, {metrics.num_output_tokens} output tokens "
                           f"(expected {expected}); first errors: {[r.error for r in load.records if not r.ok][:3]}")
    extra = {"prefix_hit_tokens": load.stat_delta("num_prefix_hit_tokens"), "num_steps": load.stat_delta("num_steps"),
             "server_startup_s": startup_s, "load_average_after": load_average()}
    log(f"zserve: {metrics.output_throughput:.1f} output tok/s in {metrics.duration_s:.1f}s; load average {load_average()}")
    return metrics, extra


def run_hf(args: argparse.Namespace, model_dir: str, requests) -> tuple[HfRun, list[HfRun]]:
    log(f"transformers: loading with {args.hf_threads} thread(s); load average {load_average()}")
    batcher = HfStaticBatcher(model_dir, args.hf_threads, args.dtype)
    batcher.generate_batch(requests[:2])  # warm-up
    search: list[HfRun] = []
    batch_size = args.hf_batch_size
    if batch_size is None:
        subset = requests[: args.hf_search_requests]
        for size in (int(s) for s in args.hf_batch_sizes.split(",")):
            run = batcher.run(subset, size, not args.no_progress, f"transformers search, batch {size}")
            log(f"transformers search: batch {size}: {run.output_throughput:.1f} output tok/s on {len(subset)} requests "
                f"({run.duration_s:.1f}s); load average {load_average()}")
            search.append(run)
        batch_size = max(search, key=lambda r: r.output_throughput).batch_size
    full = batcher.run(requests, batch_size, not args.no_progress, f"transformers, batch {batch_size}")
    log(f"transformers: batch {batch_size}: {full.output_throughput:.1f} output tok/s in {full.duration_s:.1f}s; "
        f"load average {load_average()}")
    return full, search


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model_dir = resolve_model_dir(args.model)
    in_lens = LengthRange.from_ratio(args.input_len, args.range_ratio, args.min_input_len)
    out_lens = LengthRange.from_ratio(args.output_len, args.range_ratio, args.min_output_len)
    requests = random_workload(sampleable_token_ids(model_dir), args.num_requests, in_lens, out_lens, args.seed)
    info = machine_info()
    started_s = time.time()
    zserve, zserve_extra = run_zserve(args, model_dir, requests)
    hf, search = (None, []) if args.skip_hf else run_hf(args, model_dir, requests)
    info["load_average_end"] = load_average()
    report = {
        "benchmark": "bench_offline",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "workload": {"num_requests": len(requests), "input_lens": [in_lens.min_len, in_lens.max_len],
                     "output_lens": [out_lens.min_len, out_lens.max_len], "seed": args.seed,
                     "num_prompt_tokens": sum(len(r.input_ids) for r in requests),
                     "num_output_tokens": sum(r.max_tokens for r in requests)},
        "machine": info,
        "wall_s": time.time() - started_s,
        "dtype": args.dtype,
        "zserve": {"server_args": args.server_args, **zserve.flat(), **zserve_extra},
        "transformers": None if hf is None else {"num_threads": args.hf_threads, **hf.to_json(),
                                                  "search": [r.to_json() for r in search]},
        "ratio_output_throughput": None if hf is None else zserve.output_throughput / hf.output_throughput,
        "ratio_total_throughput": None if hf is None else zserve.total_throughput / hf.total_throughput,
    }
    print(render(report), flush=True)
    write_json(args.output_json, report)
    log(f"wrote {args.output_json}")
    return report


def render(report: dict) -> str:
    w, z, hf = report["workload"], report["zserve"], report["transformers"]
    lines = [f"offline throughput: {w['num_requests']} requests, inputs {w['input_lens'][0]}-{w['input_lens'][1]} tokens, "
             f"outputs {w['output_lens'][0]}-{w['output_lens'][1]} tokens (ignore EOS, greedy), {report['dtype']} on both sides",
             f"  {'':28}{'output tok/s':>14}{'total tok/s':>14}{'duration s':>12}",
             f"  {'zserve':28}{z['output_throughput']:>14.1f}{z['total_throughput']:>14.1f}{z['duration_s']:>12.1f}"]
    if hf is not None:
        name = f"transformers (batch {hf['batch_size']}, {hf['num_threads']} thr)"
        lines.append(f"  {name:28}{hf['output_throughput']:>14.1f}{hf['total_throughput']:>14.1f}{hf['duration_s']:>12.1f}")
        lines.append(f"  zserve / transformers: output {report['ratio_output_throughput']:.2f}x, "
                     f"total {report['ratio_total_throughput']:.2f}x")
        for run in hf["search"]:
            lines.append(f"  (search) transformers batch {run['batch_size']:>3} on {run['num_requests']} requests: "
                         f"{run['output_throughput']:.1f} output tok/s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
