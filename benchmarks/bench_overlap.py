"""Overlap scheduling on and off, in one run: TPOT one request at a time against the model step alone, and a burst.

    .venv/bin/python benchmarks/bench_overlap.py [--model DIR] [--dtype auto] [--repeats 3] [--burst 64]

Two servers of the same model, one with --enable-overlap-schedule and one with
--disable-overlap-schedule, both started first and idle while the other is measured. Each repeat,
interleaved (the order flips every repeat):

  1. alone: the model worker's decode step at batch 1 in this process, as bench_step_path.py;
  2. TPOT: requests one at a time through HTTP (/v1/completions, streamed), each server
     (bench_step_path.served: p50 TPOT, and the scheduler's wait and own time per decode step);
  3. burst: `--burst` requests at once over ZMQ (`--burst-input-len` in, `--burst-output-len` out,
     ignore_eos), each server: output tokens/s and TPOT p50.

The target of issue 46: TPOT with overlap within 1.05x of the step alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_step_path import alone_runner, served, step_alone_ms  # noqa: E402
from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.metrics import RunMetrics  # noqa: E402
from benchmarks.workloads import LengthRange, random_workload, sampleable_token_ids  # noqa: E402
from testing.server_process import ServerProcess  # noqa: E402
from zserve.common.net_ports import free_port  # noqa: E402

SETTINGS = {"on": ["--enable-overlap-schedule"], "off": ["--disable-overlap-schedule"]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory or .gguf (default: the demo model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default="none", choices=["none", "int8"])
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--requests", type=int, default=3, help="requests one at a time, per repeat and server")
    p.add_argument("--burst", type=int, default=64, help="requests at once, per repeat and server")
    p.add_argument("--burst-input-len", type=int, default=128)
    p.add_argument("--burst-output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-json", type=Path, default=Path("bench_overlap.json"))
    return p.parse_args()


def burst(address: str, model: str, args: argparse.Namespace, repeat: int) -> dict[str, float]:
    token_ids = sampleable_token_ids(model)
    requests = random_workload(token_ids, args.burst, LengthRange(args.burst_input_len, args.burst_input_len),
                               LengthRange(args.burst_output_len, args.burst_output_len), seed=repeat, salt=900)
    options = LoadOptions(progress_desc=f"burst #{repeat}", model=model, num_warmup_requests=1, show_progress=False)
    run = drive(address, requests, [0.0] * len(requests), options)
    flat = RunMetrics.of_records(run.records, run.start_s).flat()
    return {"output_tok_s": flat["output_throughput"], "tpot_ms": flat["tpot.p50_ms"]}


def main() -> None:
    args = parse_args()
    model, runner, context_len = alone_runner(args)
    servers, http_ports = {}, {}
    try:
        for name, flags in SETTINGS.items():
            http_ports[name] = free_port()
            servers[name] = ServerProcess.start(model, ["--dtype", args.dtype, "--quantization", args.quantization,
                                                        "--http-port", str(http_ports[name]), "--log-level", "warning",
                                                        *flags])
        rows = []
        for repeat in range(args.repeats):
            order = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
            row = {"repeat": repeat, "load_average": load_average()[0],
                   "alone_ms": step_alone_ms(runner, context_len, num_steps=args.output_len)}
            for name in order:
                server = servers[name]
                row[name] = served(f"http://127.0.0.1:{http_ports[name]}", server.port, model, args, repeat, "http")
            for name in reversed(order):
                row[f"burst_{name}"] = burst(servers[name].address, model, args, repeat)
            rows.append(row)
            print(f"[bench_overlap] repeat {repeat}: {row}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
    machine = machine_info()
    print(f"\n{model}: TPOT one at a time ({args.input_len} in / {args.output_len} out, HTTP) and {args.burst} at once "
          f"({args.burst_input_len} in / {args.burst_output_len} out, ZMQ); --dtype {args.dtype} ({runner.dtype}); "
          f"CPU {machine['cpu']} (family/model {machine['cpu_family_model']}, kernels {machine['cpu_isa']}), "
          f"{machine['num_cores']} cores")
    print("| repeat | load | step alone ms | TPOT on ms | TPOT off ms | on / alone | off / alone | scheduler ms on / off | "
          f"{args.burst} at once tok/s on | off | on / off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        on, off, b_on, b_off = r["on"], r["off"], r["burst_on"], r["burst_off"]
        print(f"| {r['repeat']} | {r['load_average']:.1f} | {r['alone_ms']:.1f} | {on['tpot_ms']:.1f} | {off['tpot_ms']:.1f} | "
              f"{on['tpot_ms'] / r['alone_ms']:.2f} | {off['tpot_ms'] / r['alone_ms']:.2f} | "
              f"{on['schedule_ms']:.2f} / {off['schedule_ms']:.2f} | {b_on['output_tok_s']:.1f} | {b_off['output_tok_s']:.1f} | "
              f"{b_on['output_tok_s'] / b_off['output_tok_s']:.2f} |")
    med = {key: statistics.median(f(r) for r in rows) for key, f in (
        ("alone", lambda r: r["alone_ms"]), ("on", lambda r: r["on"]["tpot_ms"]), ("off", lambda r: r["off"]["tpot_ms"]),
        ("burst_on", lambda r: r["burst_on"]["output_tok_s"]), ("burst_off", lambda r: r["burst_off"]["output_tok_s"]))}
    print(f"\nmedians: step alone {med['alone']:.1f} ms; TPOT on {med['on']:.1f} ms ({med['on'] / med['alone']:.2f}x the "
          f"step alone; target 1.05x), off {med['off']:.1f} ms ({med['off'] / med['alone']:.2f}x); {args.burst} at once "
          f"{med['burst_on']:.1f} tok/s on, {med['burst_off']:.1f} off ({med['burst_on'] / med['burst_off']:.2f}x)")
    write_json(args.output_json, {"command": sys.argv, "machine": machine, "rows": rows, "medians": med})


if __name__ == "__main__":
    main()
