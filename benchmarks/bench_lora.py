"""LoRA adapters served: a burst mixing three adapters and the base model against the same burst on the base
model alone, output tokens/s of each and their ratio (issue 48's target: mixed within 1.3x of base alone).

    .venv/bin/python benchmarks/bench_lora.py [--model DIR] [--dtype auto] [--rank 16] [--burst 32] [--repeats 3]

One server (--enable-lora --lora-modules a b c: random PEFT adapters of rank `--rank` on q/k/v/o and the MLP,
written next to the report); each repeat runs both bursts, the order flipping every repeat: `base` (every request
on the base model: the path of a server without adapters, no LoRA work at all) and `mixed` (a quarter of the
requests on each adapter, a quarter on the base model, in one burst: each step batches all four through the
grouped low-rank product). Each request has `--input-len` random prompt tokens and `--output-len` output tokens
(ignore_eos), all submitted at once over ZMQ.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.machine_info import machine_info  # noqa: E402
from testing.lora_fixtures import build_peft_adapter  # noqa: E402
from testing.server_process import ServerProcess, resolve_model_dir  # noqa: E402
from zserve.client import AsyncClient  # noqa: E402

ADAPTERS = ("a", "b", "c")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--burst", type=int, default=32, help="requests at once (a multiple of 4)")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--server-args", default="", help="more launch_server flags")
    p.add_argument("--work-dir", type=Path, default=Path("bench_lora"))
    p.add_argument("--output-json", type=Path, default=Path("bench_lora.json"))
    return p.parse_args()


def lscpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


async def run_burst(port: int, prompts: list[list[int]], adapters: list[str | None], output_len: int) -> float:
    """Output tokens/s of the burst, submitted at once."""
    bodies = [{"input_ids": ids, "lora_path": name} for ids, name in zip(prompts, adapters, strict=True)]
    async with AsyncClient(port, timeout_s=600) as client:
        start = time.perf_counter()
        results = await client.results(await client.submit_all(bodies, max_tokens=output_len, ignore_eos=True))
        elapsed = time.perf_counter() - start
    num_tokens = sum(len(r.output_ids) for r in results)
    assert num_tokens == len(prompts) * output_len, num_tokens
    return num_tokens / elapsed


def main() -> None:
    args = parse_args()
    model = Path(resolve_model_dir(args.model))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    modules = []
    for i, name in enumerate(ADAPTERS):
        path = args.work_dir / f"adapter-{name}-r{args.rank}"
        if not (path / "adapter_config.json").exists():
            build_peft_adapter(path, model, seed=100 + i, rank=args.rank, alpha=2.0 * args.rank, scale=0.05)
        modules.append(f"{name}={path.resolve()}")
    flags = ["--dtype", args.dtype, "--enable-lora", "--lora-modules", *modules, "--max-lora-rank", str(args.rank),
             "--log-level", "warning", *args.server_args.split()]
    vocab = 1000  # prompt ids from the low ids every tokenizer has
    prompts = [[(7 * r + 13 * t) % vocab + 100 for t in range(args.input_len)] for r in range(args.burst)]
    mixed = [(None, *ADAPTERS)[r % 4] for r in range(args.burst)]
    runs: dict[str, list[float]] = {"base": [], "mixed": []}
    with ServerProcess.start(model, flags) as server:
        asyncio.run(run_burst(server.port, prompts[:4], mixed[:4], 4))  # warm-up: every adapter's path once
        for repeat in range(args.repeats):
            for kind in ("base", "mixed") if repeat % 2 == 0 else ("mixed", "base"):
                # a different prompt salt per run, so no run reads another's cached prefixes
                salted = [[repeat * 7 + (kind == "mixed"), *p] for p in prompts]
                adapters = mixed if kind == "mixed" else [None] * args.burst
                runs[kind].append(asyncio.run(run_burst(server.port, salted, adapters, args.output_len)))
                print(f"repeat {repeat} {kind}: {runs[kind][-1]:.1f} output tok/s", flush=True)
    base, mix = statistics.median(runs["base"]), statistics.median(runs["mixed"])
    # each repeat's two bursts ran back to back: their ratio is the least disturbed by the load of the moment
    ratios = [b / m for b, m in zip(runs["base"], runs["mixed"], strict=True)]
    cpu = lscpu_model_name()
    print(f"CPU: {cpu}")
    print(f"base alone: {base:.1f} output tok/s; mixed (3 adapters + base): {mix:.1f} output tok/s; "
          f"base / mixed = {base / mix:.2f}x (target <= 1.3x); per repeat {', '.join(f'{r:.2f}' for r in ratios)}, "
          f"median {statistics.median(ratios):.2f}x")
    write_json(args.output_json, {"machine": {**machine_info(), "lscpu_model_name": cpu},
                                  "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                  "runs": runs, "base_tok_s": base, "mixed_tok_s": mix, "ratio": base / mix,
                                  "repeat_ratios": ratios})


if __name__ == "__main__":
    main()
