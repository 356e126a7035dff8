"""Structured output's cost: serving throughput with a JSON schema per request, against the same
requests without one, on one server in one run.

    .venv/bin/python benchmarks/bench_structured.py                      # demo model, 64 chats, 3 repeats
    .venv/bin/python benchmarks/bench_structured.py --num-requests 128 --repeats 5

Each repeat sends every request at once twice: first each chat with its own generated JSON schema
(testing/json_schemas.py: nested objects, arrays, enums, bounded numbers; the answer ends where
its JSON does), then the same chats free, each made to generate exactly as many tokens as its
constrained twin did (max_tokens = that count, EOS ignored). The two runs then compute the same
number of tokens per request, and the ratio of their output throughputs is the grammar's cost:
compilation, the per-step bitmask and the masked sampling. The first repeat compiles every
schema; later repeats send the same schemas (with salted prompts, so no prefix-cache hits) and
find them in the compile cache, as a server serving one application's schemas would. Medians over
repeats are quoted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.metrics import RunMetrics  # noqa: E402
from benchmarks.workloads import BenchRequest  # noqa: E402
from testing.json_schemas import random_schemas  # noqa: E402
from testing.server_process import resolve_model_dir  # noqa: E402
from zserve import Engine  # noqa: E402

DEFAULT_SERVER_ARGS = "--log-level warning"


def log(msg: str) -> None:
    print(f"[bench_structured] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the SmolLM2-135M-Instruct demo model)")
    p.add_argument("--num-requests", type=int, default=64, help="chats per run, sent at once (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=400, help="cap on a constrained answer (tokens; default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="schema/free run pairs (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated schemas (default: %(default)s)")
    p.add_argument("--server-args", default=DEFAULT_SERVER_ARGS, help="flags for the server (default: %(default)r)")
    p.add_argument("--output-json", type=Path, default=Path("bench_structured.json"))
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def chats(schemas: list[dict], salt: str, max_tokens: list[int], with_schema: bool) -> list[BenchRequest]:
    out = []
    for schema, tokens in zip(schemas, max_tokens, strict=True):
        content = f"{salt} Write a JSON object with the fields {', '.join(schema['properties'])}."
        sampling = (("json_schema", json.dumps(schema)),) if with_schema else ()
        out.append(BenchRequest(max_tokens=tokens, messages=(("user", content),), sampling=sampling))
    return out


def run(address: str, requests: list[BenchRequest], ignore_eos: bool, desc: str, show_progress: bool) -> tuple[RunMetrics, list[int]]:
    options = LoadOptions(ignore_eos=ignore_eos, num_warmup_requests=1, progress_desc=desc, show_progress=show_progress)
    load = drive(address, requests, [0.0] * len(requests), options)
    failed = [r.error or r.finish_reason for r in load.records if not r.ok]
    if failed:
        raise RuntimeError(f"{desc}: {len(failed)} failed requests; first: {failed[0]}")
    return RunMetrics.of_records(load.records, load.start_s), [r.num_output_tokens for r in load.records]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model_dir = resolve_model_dir(args.model)
    schemas = random_schemas(args.num_requests, args.seed)
    info = machine_info()
    flags = shlex.split(args.server_args)
    log(f"launch_server {shlex.join(flags)}; load average {load_average()}")
    pairs = []
    with Engine(model_dir, server_args=flags) as engine:
        for repeat in range(args.repeats):
            constrained = chats(schemas, f"[run {repeat}a]", [args.max_tokens] * len(schemas), with_schema=True)
            schema_run, lengths = run(engine.address, constrained, False, f"schema {repeat}", not args.no_progress)
            free = chats(schemas, f"[run {repeat}b]", lengths, with_schema=False)
            free_run, free_lengths = run(engine.address, free, True, f"free {repeat}", not args.no_progress)
            assert free_lengths == lengths, "the free run generated other lengths than asked"
            ratio = schema_run.output_throughput / free_run.output_throughput
            log(f"repeat {repeat}: schema {schema_run.output_throughput:.1f} output tok/s, free {free_run.output_throughput:.1f}: "
                f"{ratio:.3f}x ({sum(lengths)} tokens each); load average {load_average()}")
            pairs.append({"schema": schema_run.flat(), "free": free_run.flat(), "ratio_output_throughput": ratio,
                          "num_output_tokens": sum(lengths)})
    info["load_average_end"] = load_average()
    report = {
        "benchmark": "bench_structured",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "workload": {"num_requests": args.num_requests, "max_tokens": args.max_tokens, "seed": args.seed},
        "server_args": args.server_args,
        "machine": info,
        "repeats": pairs,
        "median_ratio_output_throughput": statistics.median(p["ratio_output_throughput"] for p in pairs),
    }
    print(render(report), flush=True)
    write_json(args.output_json, report)
    log(f"wrote {args.output_json}")
    return report


def render(report: dict) -> str:
    w = report["workload"]
    lines = [f"structured output: {w['num_requests']} chats at once, each with its own JSON schema, against the same chats "
             f"free at the same lengths (greedy)",
             f"  {'repeat':>6}{'tokens':>8}{'schema tok/s':>14}{'free tok/s':>12}{'schema TPOT ms':>16}{'free TPOT ms':>14}{'ratio':>8}"]
    for i, p in enumerate(report["repeats"]):
        s, f = p["schema"], p["free"]
        lines.append(f"  {i:>6}{p['num_output_tokens']:>8}{s['output_throughput']:>14.1f}{f['output_throughput']:>12.1f}"
                     f"{s['tpot.p50_ms']:>16.1f}{f['tpot.p50_ms']:>14.1f}{p['ratio_output_throughput']:>8.3f}")
    lines.append(f"  median ratio (schema / free output throughput): {report['median_ratio_output_throughput']:.3f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
