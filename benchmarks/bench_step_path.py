"""Where the time between two decode steps goes, one request at a time.

    .venv/bin/python benchmarks/bench_step_path.py [--model DIR] [--dtype auto] [--quantization int8] [--repeats 3]

Three measurements of the same decode (a `--input-len` prompt, `--output-len` tokens, greedy,
`ignore_eos`), interleaved per repeat, in one run:

  1. alone: the model worker's step (ModelRunner.run) at batch 1 in this process, under the
     worker's environment, with the context the served request has halfway through;
  2. ZMQ: requests one at a time through the Python client (tcp://): TPOT from the client, and
     from the scheduler's stats the mean time it waited per step for the worker (ForwardBatch
     sent -> StepResult back: the forward, both hops and the worker's own loop), of that the
     forward as the serving worker timed it (ModelRunner.run, `worker_forward_s`), and its own
     time between steps (result -> next batch sent);
  3. HTTP: the same through the OpenAI server (`/v1/completions`, streamed).

The breakdown printed: wait - alone = the hop to the worker and back plus what the server's other
processes (detokenizer, frontend, HTTP) take from the worker's cores while it computes;
TPOT(ZMQ) - (wait + schedule) = anything else between two tokens reaching the client; TPOT(HTTP)
- TPOT(ZMQ) = the HTTP process and SSE.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model import decode_batch  # noqa: E402
from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.metrics import RunMetrics  # noqa: E402
from benchmarks.workloads import LengthRange, random_workload, sampleable_token_ids  # noqa: E402
from testing.server_process import ServerProcess, resolve_model_dir  # noqa: E402
from zserve import Client  # noqa: E402
from zserve.common.net_ports import free_port  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default="none", choices=["none", "int8"])
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--requests", type=int, default=4, help="requests one at a time, per repeat and door")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-json", type=Path, default=Path("bench_step_path.json"))
    return p.parse_args()


def step_alone_ms(runner, context_len: int, num_steps: int) -> float:
    batch = decode_batch(1, context_len, step_id=0)
    runner.run(batch)
    times = []
    for _ in range(num_steps):
        t0 = time.perf_counter()
        runner.run(batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def scheduler_totals(port: int) -> tuple[float, float, int, float]:
    """(step_wait_s, schedule_s, num_steps, worker_forward_s) from the scheduler's stats, over the
    ZMQ client (the HTTP door's stats do not carry them)."""
    with Client(port) as client:
        stats = client.stats()
    return stats["step_wait_s"], stats["schedule_s"], stats["num_steps"], stats["worker_forward_s"]


def served(address: str, port: int, model: str, args: argparse.Namespace, repeat: int, door: str) -> dict[str, float]:
    """Requests one at a time; TPOT p50 (client side) and the scheduler's mean wait and own time
    per decode step. Each request's prefill step is taken out: a request of another prompt of the
    same length with max_tokens 1 (its prefill alone) runs before it, and its wait is subtracted."""
    token_ids, in_lens = sampleable_token_ids(model), LengthRange(args.input_len, args.input_len)
    requests = random_workload(token_ids, args.requests, in_lens, LengthRange(args.output_len, args.output_len), seed=repeat, salt=100 * repeat + len(door))
    prefills = random_workload(token_ids, args.requests, in_lens, LengthRange(1, 1), seed=repeat, salt=100 * repeat + len(door) + 50)
    warmups = random_workload(token_ids, args.requests, LengthRange(8, 8), LengthRange(1, 1), seed=repeat, salt=100 * repeat + len(door) + 70)
    options = LoadOptions(progress_desc=f"{door} #{repeat}", model=model, num_warmup_requests=1, show_progress=False)
    records, waits, schedules, forwards, steps, start_s = [], 0.0, 0.0, 0.0, 0, None
    for warmup, prefill, req in zip(warmups, prefills, requests, strict=True):
        drive(address, [warmup], [0.0], options)
        before = scheduler_totals(port)
        drive(address, [prefill], [0.0], replace(options, num_warmup_requests=0))
        middle = scheduler_totals(port)
        run = drive(address, [req], [0.0], replace(options, num_warmup_requests=0))
        after = scheduler_totals(port)
        records += run.records
        start_s = run.start_s if start_s is None else start_s
        waits += (after[0] - middle[0]) - (middle[0] - before[0])  # the request's steps less one prefill
        schedules += after[1] - middle[1]
        forwards += (after[3] - middle[3]) - (middle[3] - before[3])
        steps += (after[2] - middle[2]) - (middle[2] - before[2])
    tpot = RunMetrics.of_records(records, start_s).flat()["tpot.p50_ms"]
    return {"tpot_ms": tpot, "wait_ms": waits / steps * 1e3, "schedule_ms": schedules / steps * 1e3, "forward_ms": forwards / steps * 1e3}


def alone_runner(args: argparse.Namespace):
    """(model dir, the worker's runner in this process, the context of the step alone), under the worker's
    environment: the process re-executes itself with it first."""
    if "ZSERVE_NUM_THREADS" not in os.environ:  # the worker's environment, read at process start
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(0, "cpu")})
    from testing.model_fixtures import make_runner

    model = resolve_model_dir(args.model)
    context_len = args.input_len + args.output_len // 2
    runner = make_runner(model, device="cpu", dtype=args.dtype, page_size=16, kv_cache_tokens=context_len + 64,
                         num_threads=int(os.environ["ZSERVE_NUM_THREADS"]), quantization=args.quantization)
    return model, runner, context_len


def main() -> None:
    args = parse_args()
    model, runner, context_len = alone_runner(args)
    http_port = free_port()
    rows = []
    with ServerProcess.start(model, ["--dtype", args.dtype, "--quantization", args.quantization, "--http-port", str(http_port), "--log-level", "warning"]) as server:
        for repeat in range(args.repeats):
            load = load_average()[0]
            alone = step_alone_ms(runner, context_len, num_steps=args.output_len)
            zmq = served(server.address, server.port, model, args, repeat, "zmq")
            http = served(f"http://127.0.0.1:{http_port}", server.port, model, args, repeat, "http")
            rows.append({"repeat": repeat, "load_average": load, "alone_ms": alone, "zmq": zmq, "http": http})
            print(f"[bench_step_path] repeat {repeat}: alone {alone:.1f} ms, ZMQ {zmq}, HTTP {http}", file=sys.stderr)
    machine = machine_info()
    print(f"\none request at a time, {args.input_len} in / {args.output_len} out, --dtype {args.dtype} ({runner.dtype}, "
          f"{runner.gemm_backend} GEMM); CPU {machine['cpu']} (family/model {machine['cpu_family_model']}, kernels {machine['cpu_isa']}), "
          f"{machine['num_cores']} cores")
    print("| repeat | load | step alone ms | forward in the server ms (ZMQ) | step wait ms (ZMQ) | scheduler ms (ZMQ) | TPOT p50 ZMQ ms | "
          "step wait ms (HTTP) | TPOT p50 HTTP ms | TPOT HTTP / alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        z, h = r["zmq"], r["http"]
        print(f"| {r['repeat']} | {r['load_average']:.1f} | {r['alone_ms']:.1f} | {z['forward_ms']:.1f} | {z['wait_ms']:.1f} | {z['schedule_ms']:.2f} | {z['tpot_ms']:.1f} | "
              f"{h['wait_ms']:.1f} | {h['tpot_ms']:.1f} | {h['tpot_ms'] / r['alone_ms']:.2f} |")
    med = {key: statistics.median(f(r) for r in rows) for key, f in (
        ("alone", lambda r: r["alone_ms"]), ("wait", lambda r: r["http"]["wait_ms"]), ("schedule", lambda r: r["http"]["schedule_ms"]),
        ("zmq", lambda r: r["zmq"]["tpot_ms"]), ("http", lambda r: r["http"]["tpot_ms"]))}
    print(f"\nmedians over repeats (HTTP): step alone {med['alone']:.1f} ms; step wait {med['wait']:.1f} ms "
          f"(+{med['wait'] - med['alone']:.1f}: hops and the other processes on the worker's cores); scheduler {med['schedule']:.2f} ms; "
          f"rest {med['http'] - med['wait'] - med['schedule']:.1f} ms; TPOT {med['http']:.1f} ms = {med['http'] / med['alone']:.2f}x the step alone "
          f"(ZMQ client: {med['zmq']:.1f} ms)")
    write_json(args.output_json, {"command": sys.argv, "machine": machine, "rows": rows, "medians": med})


if __name__ == "__main__":
    main()
