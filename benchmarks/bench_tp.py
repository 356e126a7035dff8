"""Decode throughput at --tp-size 1 and --tp-size 2 (one torch thread per rank), in one run.

    .venv/bin/python benchmarks/bench_tp.py                    # the demo model's shape
    .venv/bin/python benchmarks/bench_tp.py --model DIR --tp-sizes 1,2,4 --batch-sizes 1,8

Both servers start at the start and stay up; the measurements alternate between them, round
after round (the order flips every round), so load from other processes on the machine falls
on both alike. The figure is the median over rounds.

Decode throughput of a batch of B requests: the batch is run twice, generating SHORT and then
LONG tokens per request (EOS ignored, fresh random prompts each time, so no prefix hits):

    decode tokens/s = B * (LONG - SHORT) / (wall time of the LONG run - wall time of the SHORT run)

Prefill, start-up and client overheads are the same in both runs and cancel out.

Alongside, the latency of one gloo all-reduce of a [1, hidden] tensor between two processes on
loopback, before and after the rounds: a tp 2 decode step of a Llama makes 2 per layer, plus
one for the embedding and an all-gather for the logits, and on a busy machine each waits for
the other process to be scheduled.

The demo model (SmolLM2-135M) has 9 attention heads and 3 KV heads, which do not split over 2
ranks (nor do they in vLLM or SGLang, which also split heads evenly). Without --model the
benchmark therefore runs the demo model's shape with 8 heads of 72 (hidden size 576 and the q/o
projections unchanged) and 2 KV heads, random weights: the same work per token within ~1%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine_info import machine_info  # noqa: E402
from testing.server_process import ServerProcess, resolve_model_dir  # noqa: E402
from zserve.client import Client  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_tp] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model's shape with heads that split, see above)")
    p.add_argument("--tp-sizes", default="1,2")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--short-tokens", type=int, default=8)
    p.add_argument("--long-tokens", type=int, default=72)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-args", default="--num-threads 1 --kv-cache-tokens 8192 --log-level warning")
    p.add_argument("--output-json", default="", help="also write the figures here")
    return p.parse_args(argv)


def demo_shaped_model(target: Path) -> Path:
    """The demo model's config with 8 heads x 72 and 2 KV heads; random weights; its tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    demo = Path(resolve_model_dir(""))
    raw = json.loads((demo / "config.json").read_text())
    raw.update(num_attention_heads=8, num_key_value_heads=2, head_dim=72)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in raw.items() if not k.startswith("_")}))
    model.save_pretrained(target)
    for f in demo.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copy(f, target / f.name)
    return target


def _allreduce_rank(rank: int, store: str, hidden: int, num_iters: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    x = torch.zeros(1, hidden)
    for _ in range(20):
        dist.all_reduce(x)
    t0 = time.perf_counter()
    for _ in range(num_iters):
        dist.all_reduce(x)
    if rank == 0:
        Path(out_path).write_text(str((time.perf_counter() - t0) / num_iters * 1e6))
    dist.destroy_process_group()


def allreduce_latency_us(hidden: int, num_iters: int = 300) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench-tp-ar-") as tmp:
        out_path = f"{tmp}/us"
        mp.start_processes(_allreduce_rank, args=(f"{tmp}/store", hidden, num_iters, out_path), nprocs=2, start_method="spawn")
        return float(Path(out_path).read_text())


def timed_batch(address: str, batch_size: int, prompt_len: int, max_tokens: int, rng: np.random.Generator) -> float:
    with Client(address, timeout_s=600) as c:
        prompts = [rng.integers(100, 10_000, size=prompt_len).tolist() for _ in range(batch_size)]
        t0 = time.perf_counter()
        req_ids = [c.submit(input_ids=p, max_tokens=max_tokens, ignore_eos=True, temperature=0.0) for p in prompts]
        results = [c.result(r) for r in req_ids]
        elapsed_s = time.perf_counter() - t0
    assert all(r.usage.completion_tokens == max_tokens for r in results), [r.usage for r in results]
    return elapsed_s


def decode_tok_s(address: str, batch_size: int, args: argparse.Namespace, rng: np.random.Generator) -> float:
    short_s = timed_batch(address, batch_size, args.prompt_len, args.short_tokens, rng)
    long_s = timed_batch(address, batch_size, args.prompt_len, args.long_tokens, rng)
    return batch_size * (args.long_tokens - args.short_tokens) / (long_s - short_s)


def run(args: argparse.Namespace, model_dir: str) -> dict:
    tp_sizes = [int(x) for x in args.tp_sizes.split(",")]
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    log(f"starting {len(tp_sizes)} servers on {model_dir}")
    pending = {tp: ServerProcess.spawn(model_dir, [*args.server_args.split(), "--tp-size", str(tp)]) for tp in tp_sizes}
    servers = {tp: p.wait_ready(600) for tp, p in pending.items()}
    hidden = json.loads((Path(model_dir) / "config.json").read_text())["hidden_size"]
    latency_us = [allreduce_latency_us(hidden)]
    try:
        rng = np.random.default_rng(0)
        for server in servers.values():  # warm-up
            timed_batch(server.address, max(batch_sizes), args.prompt_len, 4, rng)
        figures: dict[str, list[float]] = {f"tp{tp}/b{b}": [] for tp in tp_sizes for b in batch_sizes}
        for round_idx in range(args.rounds):
            order = tp_sizes if round_idx % 2 == 0 else tp_sizes[::-1]
            for b in batch_sizes:
                for tp in order:
                    value = decode_tok_s(servers[tp].address, b, args, rng)
                    figures[f"tp{tp}/b{b}"].append(value)
                    log(f"round {round_idx + 1}: tp {tp}, batch {b}: {value:.1f} decode tokens/s")
    finally:
        for server in servers.values():
            server.stop()
    latency_us.append(allreduce_latency_us(hidden))
    return {"model": model_dir, "args": vars(args), "machine": machine_info(), "decode_tok_s": figures, "allreduce_us": latency_us}


def render(report: dict, tp_sizes: list[int], batch_sizes: list[int]) -> str:
    figures = report["decode_tok_s"]
    lines = [f"decode throughput, tokens/s (median of {report['args']['rounds']} rounds; min-max), one thread per rank",
             f"model {report['model']}; {report['machine']['num_cores']} cores, {report['machine']['cpu']}; "
             f"load average {' '.join(f'{x:.1f}' for x in report['machine']['load_average'])} at the end",
             f"{'batch':>5} " + " ".join(f"{'tp ' + str(tp):>24}" for tp in tp_sizes) + f" {'tp' + str(tp_sizes[-1]) + '/tp' + str(tp_sizes[0]):>9}"]
    for b in batch_sizes:
        cells, medians = [], []
        for tp in tp_sizes:
            values = figures[f"tp{tp}/b{b}"]
            medians.append(statistics.median(values))
            cells.append(f"{medians[-1]:8.1f} ({min(values):6.1f}-{max(values):6.1f})")
        lines.append(f"{b:>5} " + " ".join(f"{c:>24}" for c in cells) + f" {medians[-1] / medians[0]:>8.2f}x")
    before_us, after_us = report["allreduce_us"]
    lines.append(f"gloo all-reduce of [1, hidden] between 2 processes: {before_us:.0f} us before the rounds, {after_us:.0f} us after")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the probe's ranks, like the server's, on loopback
    with tempfile.TemporaryDirectory(prefix="bench-tp-") as tmp:
        model_dir = args.model or str(demo_shaped_model(Path(tmp) / "smollm2-135m-shaped"))
        report = run(args, model_dir)
    if not args.model:
        report["model"] = "SmolLM2-135M shape, 8 heads x 72 / 2 KV heads, random weights"
    print(render(report, [int(x) for x in args.tp_sizes.split(",")], [int(x) for x in args.batch_sizes.split(",")]))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
