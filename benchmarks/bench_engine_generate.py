"""zserve.Engine.generate over one large offline batch, as vLLM's `LLM.generate` users call it.

    # the acceptance run: 20,000 prompts, 8 tokens each, the demo model at default flags
    .venv/bin/python benchmarks/bench_engine_generate.py --num-prompts 20000 --max-tokens 8

Distinct text prompts of 5 to 20 words go to one `generate` call (greedy, EOS ignored, so every
prompt generates exactly --max-tokens), with its progress bar unless --no-progress. Prints the
wall time of the call (the server's startup apart), prompts/s and input/output tokens/s, and
checks that every result is its prompt's: each result's prompt_tokens must equal what the
model's tokenizer makes of the prompt at the same index (a result out of order fails the run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers import Tokenizer  # noqa: E402

from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from testing.server_process import resolve_model_dir  # noqa: E402
from zserve import Engine  # noqa: E402

WORDS = ("river", "stone", "quiet", "market", "seven", "lantern", "orbit", "garden", "copper", "winter", "signal",
         "harbor", "violet", "engine", "meadow", "puzzle", "thunder")


def prompts(num: int) -> list[str]:
    """Prompt i: its number and 5 + i % 16 words, so neighbours differ in length."""
    return [f"Note {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(5 + i % 16)) for i in range(num)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the SmolLM2-135M-Instruct demo model)")
    p.add_argument("--num-prompts", type=int, default=20_000)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--server-args", default="", help="launch_server flags (default: none, the server's defaults)")
    p.add_argument("--no-progress", action="store_true", help="use_tqdm=False")
    p.add_argument("--output-json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_dir = resolve_model_dir(args.model)
    batch = prompts(args.num_prompts)
    expected_lens = [len(e.ids) for e in Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")).encode_batch(batch)]
    print(f"[bench_engine_generate] load average {load_average()}", file=sys.stderr, flush=True)
    with Engine(model_dir, server_args=shlex.split(args.server_args), echo_logs=False) as engine:
        started_s = time.perf_counter()
        results = engine.generate(batch, {"max_tokens": args.max_tokens, "ignore_eos": True}, use_tqdm=not args.no_progress)
        wall_s = time.perf_counter() - started_s
        max_in_flight = engine.max_in_flight
    num_in = sum(r.usage.prompt_tokens for r in results)
    num_out = sum(r.usage.completion_tokens for r in results)
    misplaced = [i for i, (r, n) in enumerate(zip(results, expected_lens, strict=True)) if r.usage.prompt_tokens != n]
    short = [i for i, r in enumerate(results) if len(r.output_ids) != args.max_tokens]
    report = {
        "num_prompts": len(batch), "max_tokens": args.max_tokens, "server_args": args.server_args, "max_in_flight": max_in_flight,
        "wall_s": wall_s, "prompts_per_s": len(batch) / wall_s, "input_tokens_per_s": num_in / wall_s,
        "output_tokens_per_s": num_out / wall_s, "num_input_tokens": num_in, "num_output_tokens": num_out,
        "num_misplaced": len(misplaced), "num_short": len(short), "machine": machine_info(),
    }
    print(
        f"{len(batch)} prompts x {args.max_tokens} tokens in {wall_s:.1f} s: {report['prompts_per_s']:.1f} prompts/s, "
        f"input {report['input_tokens_per_s']:,.0f} tok/s, output {report['output_tokens_per_s']:,.0f} tok/s "
        f"({max_in_flight} in flight at most); in prompt order: {'yes' if not misplaced else f'NO, first at {misplaced[0]}'}"
    )
    if args.output_json is not None:
        write_json(args.output_json, report)
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "machine"}))
    return 0 if not misplaced and not short else 1


if __name__ == "__main__":
    sys.exit(main())
