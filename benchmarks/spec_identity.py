"""Greedy identity of speculative decoding on the served demo model and the echo workload:

    .venv/bin/python benchmarks/spec_identity.py [--dtype bfloat16] [--num-prompts 30]

Two servers (without and with `--speculative-algorithm ngram`); the same greedy chat requests
(benchmarks/workloads.py echo_workload) one at a time to each, then all at once to the one
without speculation. Prints how many answers are identical between speculation and none, and
between one at a time and all at once without speculation: the second count is what batch shape
alone does to greedy text in this dtype (BENCHMARKS.md section 18).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.workloads import echo_workload  # noqa: E402
from testing.server_process import resolve_model_dir, start_server  # noqa: E402
from zserve.client import Client  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=200)
    args = p.parse_args()
    model = resolve_model_dir(args.model)
    chats = [[{"role": "user", "content": r.messages[0][1]}] for r in echo_workload(args.num_prompts, args.max_tokens, seed=0, salt=11)]
    plain = start_server(model, "--dtype", args.dtype, timeout_s=300)
    spec = start_server(model, "--dtype", args.dtype, "--speculative-algorithm", "ngram", timeout_s=300)
    try:
        with Client(plain.port, timeout_s=600) as c_plain, Client(spec.port, timeout_s=600) as c_spec:
            alone = [c_plain.generate(messages=m, max_tokens=args.max_tokens).output_ids for m in chats]
            drafted = [c_spec.generate(messages=m, max_tokens=args.max_tokens).output_ids for m in chats]
            together = [r.output_ids for r in c_plain.results(c_plain.submit_all([{"messages": m} for m in chats], max_tokens=args.max_tokens))]
            stats = c_spec.stats()
    finally:
        plain.stop()
        spec.stop()
    n = len(chats)
    print(f"{Path(model).name}, --dtype {args.dtype}, {n} echo prompts, greedy: identical with and without speculation "
          f"{sum(a == b for a, b in zip(alone, drafted, strict=True))}/{n}; without speculation, one at a time and {n} at once "
          f"{sum(a == b for a, b in zip(alone, together, strict=True))}/{n}; drafts accepted "
          f"{stats['num_accepted_tokens']}/{stats['num_draft_tokens']}")


if __name__ == "__main__":
    main()
