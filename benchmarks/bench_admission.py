"""Admission under KV pressure: how many requests run at once, and whether their outputs stay exact.

    # 64 chats without max_tokens, estimated reservation (default) against full, one run
    .venv/bin/python benchmarks/bench_admission.py --scenario chats --compare "" "--kv-reservation full"

    # a pool small enough to force retraction, against a large pool (the reference outputs)
    .venv/bin/python benchmarks/bench_admission.py --scenario retract \\
        --compare "--kv-cache-tokens 2048" "--kv-cache-tokens 65536" --reference last

    # 8 identical 200-token prompts at once
    .venv/bin/python benchmarks/bench_admission.py --scenario identical

Scenarios (greedy, all requests sent at once through one AsyncClient):
- chats: `--num-requests` distinct chat questions with no limit (max_tokens=None: what OpenAI-style
  clients send without max_tokens), so each may generate up to the context;
- retract: `--num-requests` prompts of `--input-len` random token ids, `--output-len` tokens each
  (ignore_eos), so every request needs its whole output;
- identical: `--num-requests` copies of one prompt of `--input-len` random token ids.

Each configuration of --compare gets its own server (`--model`, --server-args, then its flags),
all started together; runs are interleaved over `--repeats`. While a run goes, the server's
stats are polled every 50 ms for the peak number of running requests. After it, the script waits
for the server to go idle and reads what was computed, retracted and left allocated (a leaked
page shows as used or reserved at idle). Outputs are compared token by token with a reference:
`sequential` (the same requests sent one at a time to the first server), `last` (the last
configuration's outputs in the same repeat) or `none`.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_args import split_compare  # noqa: E402
from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.workloads import sampleable_token_ids  # noqa: E402
from testing.server_process import ServerProcess, resolve_model_dir  # noqa: E402
from zserve.client import AsyncClient  # noqa: E402

TOPICS = (
    "the moon", "bread", "rivers", "bicycles", "volcanoes", "libraries", "tea", "glaciers", "owls", "bridges",
    "deserts", "chess", "honey", "lighthouses", "maps", "coral reefs", "violins", "trains", "salt", "comets",
)
QUESTION_FORMS = (
    "Tell me three facts about {}.", "Write a short poem about {}.", "Why do people like {}?",
    "Explain {} to a child.", "What is the history of {}?",
)
POLL_INTERVAL_S = 0.05


@dataclass(slots=True)
class Run:
    config: str
    output_ids: list[list[int]]
    finish_reasons: list[str | None]
    errors: list[str]
    wall_s: float
    peak_running: int
    stats_before: dict
    stats_after: dict
    ttft_s: list[float] = field(default_factory=list)

    def delta(self, name: str) -> int:
        return int(self.stats_after.get(name, 0)) - int(self.stats_before.get(name, 0))

    @property
    def output_tokens(self) -> int:
        return sum(len(ids) for ids in self.output_ids)


def build_requests(args: argparse.Namespace, model_dir: str) -> list[dict]:
    """Client keyword arguments, one dict per request."""
    rng = np.random.default_rng(args.seed)
    if args.scenario == "chats":
        questions = [QUESTION_FORMS[i % len(QUESTION_FORMS)].format(TOPICS[i // len(QUESTION_FORMS) % len(TOPICS)])
                     + ("" if i < len(TOPICS) * len(QUESTION_FORMS) else f" (variant {i})") for i in range(args.num_requests)]
        return [{"messages": [{"role": "user", "content": q}], "temperature": 0.0, "max_tokens": None} for q in questions]
    vocab = sampleable_token_ids(model_dir)
    if args.scenario == "identical":
        ids = rng.choice(vocab, args.input_len).tolist()
        return [{"input_ids": ids, "max_tokens": args.output_len, "temperature": 0.0} for _ in range(args.num_requests)]
    return [
        {"input_ids": rng.choice(vocab, args.input_len).tolist(), "max_tokens": args.output_len, "temperature": 0.0,
         "ignore_eos": True}
        for _ in range(args.num_requests)
    ]


async def run_once(address: str, config: str, requests: list[dict], *, concurrent: bool) -> Run:
    async with AsyncClient(address) as client:
        await client.generate("Warm-up: say hi.", max_tokens=2, temperature=0.0)
        stats_before = await client.stats()
        peak = 0
        done = asyncio.Event()

        async def poll() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, int((await client.stats())["num_running"]))
                await asyncio.sleep(POLL_INTERVAL_S)

        bar = tqdm(total=len(requests), desc=f"{config or '(defaults)'}", unit="req", file=sys.stderr, mininterval=2.0)

        async def one(kwargs: dict):
            try:
                return await client.generate(**kwargs)
            except Exception as exc:  # noqa: BLE001 - a failed request is a figure of the run, not a crash
                return exc
            finally:
                bar.update(1)

        poller = asyncio.create_task(poll())
        t0 = time.perf_counter()
        if concurrent:
            results = await asyncio.gather(*(one(kw) for kw in requests))
        else:
            results = [await one(kw) for kw in requests]
        wall_s = time.perf_counter() - t0
        done.set()
        await poller
        bar.close()
        stats_after = await wait_idle(client)
    ok = [r for r in results if not isinstance(r, BaseException)]
    return Run(
        config=config,
        output_ids=[list(r.output_ids) if not isinstance(r, BaseException) else [] for r in results],
        finish_reasons=[None if isinstance(r, BaseException) else r.finish_reason for r in results],
        errors=[f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)],
        wall_s=wall_s,
        peak_running=peak,
        stats_before=stats_before,
        stats_after=stats_after,
        ttft_s=[r.ttft_s for r in ok if r.ttft_s is not None],
    )


async def wait_idle(client: AsyncClient, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await client.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["num_prefilling"] == 0:
            return stats
        if time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


def compare_outputs(run: Run, reference: list[list[int]]) -> int:
    """How many requests' output ids differ from the reference's."""
    return sum(a != b for a, b in zip(run.output_ids, reference, strict=True))


def summarize(run: Run, reference: list[list[int]] | None) -> dict:
    return {
        "config": run.config,
        "requests": len(run.output_ids),
        "errors": len(run.errors),
        "wall_s": run.wall_s,
        "output_tokens": run.output_tokens,
        "output_tok_s": run.output_tokens / run.wall_s,
        "peak_running": run.peak_running,
        "retracted": run.delta("num_retracted"),
        "prefilled_tokens": run.delta("num_prefilled_tokens"),
        "ttft_spread_s": (max(run.ttft_s) - min(run.ttft_s)) if run.ttft_s else None,
        "used_pages_at_idle": run.stats_after.get("num_used_pages"),
        "reserved_pages_at_idle": run.stats_after.get("num_reserved_pages"),
        "outputs_differing": None if reference is None else compare_outputs(run, reference),
        "error_samples": run.errors[:3],
    }


def print_table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    head = ("config", "repeat", "errors", "wall s", "out tok/s", "ratio", "peak running", "retracted", "prefilled",
            "TTFT spread s", "used/reserved at idle", "outputs differing")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        spread = "" if row["ttft_spread_s"] is None else f"{row['ttft_spread_s']:.2f}"
        differing = "" if row["outputs_differing"] is None else str(row["outputs_differing"])
        print(f"| {row['config'] or '(defaults)'} | {row['repeat']} | {row['errors']} | {row['wall_s']:.1f} | "
              f"{row['output_tok_s']:.1f} | {row['ratio']:.2f}x | {row['peak_running']} | {row['retracted']} | "
              f"{row['prefilled_tokens']} | {spread} | {row['used_pages_at_idle']}/{row['reserved_pages_at_idle']} | {differing} |")
    for row in rows:
        for sample in row["error_samples"]:
            print(f"  [{row['config'] or '(defaults)'}] {sample}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=("chats", "retract", "identical"), default="chats")
    p.add_argument("--model", default="", help="model directory (default: the SmolLM2-135M-Instruct demo model)")
    p.add_argument("--server-args", default="--log-level warning", help="flags for every server")
    p.add_argument("--compare", nargs="+", default=None, metavar="FLAGS",
                   help='server configurations, each one quoted string of launch_server flags ("" = the defaults)')
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--reference", choices=("sequential", "last", "none"), default="none")
    p.add_argument("--num-requests", type=int, default=None, help="default: chats 64, retract 32, identical 8")
    p.add_argument("--input-len", type=int, default=None, help="prompt tokens (retract: 100, identical: 200)")
    p.add_argument("--output-len", type=int, default=None, help="output tokens (retract: 400, identical: 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", type=Path, default=Path("bench_admission.json"))
    argv, compare = split_compare(sys.argv[1:], set(p._option_string_actions))
    args = p.parse_args(argv)
    args.compare = compare or [""]
    defaults = {"chats": (64, 0, 0), "retract": (32, 100, 400), "identical": (8, 200, 16)}[args.scenario]
    args.num_requests = args.num_requests or defaults[0]
    args.input_len = args.input_len or defaults[1]
    args.output_len = args.output_len or defaults[2]
    return args


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args.model)
    requests = build_requests(args, model_dir)
    load_start = load_average()
    print(f"[bench_admission] starting {len(args.compare)} server(s)", file=sys.stderr)
    pending = [ServerProcess.spawn(model_dir, [*shlex.split(args.server_args), *shlex.split(c)]) for c in args.compare]
    servers = [p.wait_ready() for p in pending]
    rows: list[dict] = []
    try:
        reference = None
        if args.reference == "sequential":
            print(f"[bench_admission] reference: {len(requests)} requests one at a time", file=sys.stderr)
            reference = asyncio.run(run_once(servers[0].address, "sequential", requests, concurrent=False)).output_ids
        for repeat in range(args.repeats):
            runs = []
            for config, server in zip(args.compare, servers, strict=True):
                print(f"[bench_admission] repeat {repeat + 1}/{args.repeats}: {config or '(defaults)'}", file=sys.stderr)
                runs.append(asyncio.run(run_once(server.address, config, requests, concurrent=True)))
            ref = runs[-1].output_ids if args.reference == "last" else reference
            base = runs[0].output_tokens / runs[0].wall_s
            for run in runs:
                row = summarize(run, ref)
                row["repeat"] = repeat
                row["ratio"] = row["output_tok_s"] / base
                rows.append(row)
    finally:
        for server in servers:
            server.request_stop()
        for server in servers:
            server.wait_stopped()
    title = (f"{args.scenario}: {args.num_requests} requests at once, model {Path(model_dir).name}, "
             f"load average {load_start[0]:.1f} at start, {load_average()[0]:.1f} at end; ratio = output tok/s / first config's")
    print_table(rows, title)
    if len(rows) > len(args.compare):
        for config in args.compare:
            ratios = [r["ratio"] for r in rows if r["config"] == config]
            print(f"median ratio {config or '(defaults)'}: {statistics.median(ratios):.2f}x over {len(ratios)} repeats")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(args.output_json, {"command": sys.argv, "machine": machine_info(), "args": settings, "rows": rows})


if __name__ == "__main__":
    main()
