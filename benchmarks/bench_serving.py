"""Serving benchmark: streaming latency and throughput under load, through the async client.

    # the design posts' mix, paced arrivals, two server configurations in one run, 3 repeats
    .venv/bin/python benchmarks/bench_serving.py --prompt-repeats 1,1,1,64 --submit-interval-ms 200 \\
        --compare "--chunked-prefill-size 64" "--chunked-prefill-size 4096" --repeats 3

    # random lengths, Poisson arrivals; shared prefixes with the radix cache on and off
    .venv/bin/python benchmarks/bench_serving.py --workload random --input-len 256 --output-len 64 --request-rate 2
    .venv/bin/python benchmarks/bench_serving.py --workload shared-prefix --compare "" "--disable-radix-cache"

    # a server that is already running (no --compare)
    .venv/bin/python benchmarks/bench_serving.py --address tcp://127.0.0.1:30000 --workload random

Each configuration of --compare gets its own server (`--model`, then --server-args, then the
configuration's flags; a later flag wins); all start together and stay up until the end. Runs
are interleaved ([0] [1] [0] [1] ...), each after warm-up requests; every repeat's prompts are
salted so no repeat hits the prefix cache of an earlier one. Medians over repeats are quoted;
ratios are taken against the first configuration per repeat. Prints a table; writes JSON (--output-json) and a
PNG (--output-png). Metric definitions: benchmarks/metrics.py.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.arrival_schedule import arrival_offsets_s, describe_arrivals  # noqa: E402
from benchmarks.compare_args import split_compare  # noqa: E402
from benchmarks.config_runs import ConfigRuns  # noqa: E402
from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.latency_plot import plot_runs  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.results_table import render_table  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    DEFAULT_BASE_PROMPT,
    BenchRequest,
    LengthRange,
    echo_workload,
    parse_counts,
    random_workload,
    repeats_workload,
    sampleable_token_ids,
    shared_prefix_workload,
)
from testing.server_process import ServerProcess, resolve_model_dir  # noqa: E402

DEFAULT_SERVER_ARGS = "--log-level warning"


def log(msg: str) -> None:
    print(f"[bench_serving] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--model", default="", help="model directory (default: the SmolLM2-135M-Instruct demo model)")
    g.add_argument("--address", default=None, help="drive a running server at this address (tcp://HOST:PORT, or http://HOST:PORT) instead of starting one")
    g.add_argument("--tokenizer", default=None, help="model directory whose tokenizer builds the random and shared-prefix prompts "
                   "(default: --model, or with --address the running server's own model)")
    g.add_argument("--server-args", default=DEFAULT_SERVER_ARGS, help="flags for every server this script starts (default: %(default)r)")
    g.add_argument("--compare", nargs="+", default=None, metavar="FLAGS",
                   help='server configurations to compare, each one quoted string of launch_server flags ("" = the defaults); '
                        'the first is the baseline; everything up to the next option of this script is a configuration')
    g.add_argument("--repeats", type=int, default=1, help="runs per configuration, interleaved; medians are quoted")
    g.add_argument("--server-log", type=Path, default=None, help="append every started server's output to this file")

    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=("repeats", "random", "shared-prefix", "echo"), default="repeats",
                   help="echo: chat requests whose answers copy the prompt (speculative decoding's workload; pair with --no-ignore-eos)")
    g.add_argument("--num-requests", type=int, default=32, help="requests per run (repeats and random workloads)")
    g.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per request (repeats and shared-prefix)")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens (default on, so every configuration does the same work)")
    g.add_argument("--seed", type=int, default=0, help="seed of random prompts and Poisson arrivals")
    g.add_argument("--base-prompt", default=DEFAULT_BASE_PROMPT, help="repeats: the text repeated")
    g.add_argument("--prompt-repeats", default="1,1,1,64", help="repeats: cycle of repeat counts of the base prompt, e.g. 1,1,1,64 or 512,1,1,1")
    g.add_argument("--unique-prompts", action="store_true", help="repeats: append a distinct suffix per request (repeated prompts still share a prefix)")
    g.add_argument("--unique-prefix", action="store_true", help="repeats: put the distinct tag first, so no two requests share a cached prefix")
    g.add_argument("--input-len", type=int, default=256, help="random: longest prompt (tokens)")
    g.add_argument("--output-len", type=int, default=64, help="random: longest output (tokens)")
    g.add_argument("--range-ratio", type=float, default=1.0,
                   help="random: SGLang's convention, lengths uniform in [max(1, int(LEN * ratio)), LEN]; 1.0 = fixed lengths")
    g.add_argument("--min-input-len", type=int, default=None, help="random: shortest prompt, overriding --range-ratio")
    g.add_argument("--min-output-len", type=int, default=None, help="random: shortest output, overriding --range-ratio")
    g.add_argument("--num-groups", type=int, default=4, help="shared-prefix: system prompts")
    g.add_argument("--prompts-per-group", type=int, default=8, help="shared-prefix: questions per system prompt")
    g.add_argument("--system-prompt-len", type=int, default=512, help="shared-prefix: tokens of each system prompt")
    g.add_argument("--question-len", type=int, default=32, help="shared-prefix: tokens of each question")

    g = p.add_argument_group("arrivals")
    a = g.add_mutually_exclusive_group()
    a.add_argument("--submit-interval-ms", type=float, default=None, help="paced: one request every this many ms")
    a.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals at this many requests/s (inf = all at once)")

    g = p.add_argument_group("output")
    g.add_argument("--output-json", type=Path, default=None, help="write every figure here (default: bench_serving.json)")
    g.add_argument("--output-png", type=Path, default=None, help="write the plot here (default: the JSON path with .png)")
    g.add_argument("--title", default=None, help="title of the table and plot")
    g.add_argument("--warmup-requests", type=int, default=2, help="short unrelated requests before each run")
    g.add_argument("--request-timeout-s", type=float, default=None, help="fail a request that has not finished by then")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    argv, compare = split_compare(sys.argv[1:] if argv is None else argv, set(p._option_string_actions))
    args = p.parse_args(argv)
    args.compare = compare
    if args.address is not None and args.compare is not None:
        p.error("--compare starts its own servers; it cannot be used with --address")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    args.output_json = args.output_json or Path("bench_serving.json")
    args.output_png = args.output_png or args.output_json.with_suffix(".png")
    return args


def build_workload(args: argparse.Namespace, model_dir: str, repeat: int) -> tuple[list[BenchRequest], str]:
    """The same workload for every configuration; each repeat salted so that a server which
    served the previous repeats gets no prefix hits from them."""
    if args.workload == "repeats":
        counts = parse_counts(args.prompt_repeats)
        unique = "prefix" if args.unique_prefix else "suffix" if args.unique_prompts else "none"
        salt = f"Run {repeat + 1}. "
        requests = repeats_workload(args.base_prompt, counts, args.num_requests, args.max_tokens, unique, salt)
        return requests, f"repeats {args.prompt_repeats} of {args.base_prompt!r}, unique={unique}, max_tokens={args.max_tokens}"
    if args.workload == "echo":
        requests = echo_workload(args.num_requests, args.max_tokens, args.seed, salt=repeat)
        return requests, f"echo (fix typos / repeat / rename in code, chat), max_tokens={args.max_tokens}"
    token_ids = sampleable_token_ids(model_dir)
    if args.workload == "random":
        in_lens = LengthRange.from_ratio(args.input_len, args.range_ratio, args.min_input_len)
        out_lens = LengthRange.from_ratio(args.output_len, args.range_ratio, args.min_output_len)
        requests = random_workload(token_ids, args.num_requests, in_lens, out_lens, args.seed, salt=repeat)
        return requests, f"random ids, input {in_lens.min_len}-{in_lens.max_len}, output {out_lens.min_len}-{out_lens.max_len} tokens"
    requests = shared_prefix_workload(token_ids, args.num_groups, args.prompts_per_group, args.system_prompt_len,
                                      args.question_len, args.max_tokens, args.seed, salt=repeat)
    return requests, (f"shared prefix: {args.num_groups} groups x {args.prompts_per_group} questions, system "
                      f"{args.system_prompt_len} + question {args.question_len} tokens, max_tokens={args.max_tokens}")


def start_servers(model_dir: str, configs: list[ConfigRuns], log_path: Path | None) -> list[ServerProcess]:
    """One server per configuration, loading at the same time; all stay up for the whole run
    (idle ones wait on their sockets), so repeats can be interleaved without restarts."""
    for i, config in enumerate(configs):
        log(f"starting server [{i}]: launch_server {shlex.join(config.flags)}")
    pending = [ServerProcess.spawn(model_dir, c.flags, log_path=log_path) for c in configs]
    servers: list[ServerProcess] = []
    try:
        for config, p in zip(configs, pending, strict=True):
            servers.append(p.wait_ready())
            config.server_startup_s = servers[-1].startup_s
    except BaseException:
        for p in pending:
            p.kill()
        raise
    log(f"{len(servers)} server(s) ready in {max(s.startup_s for s in servers):.1f}s")
    return servers


def tokenizer_dir(args: argparse.Namespace) -> str:
    """The model directory whose tokenizer builds the prompts: --tokenizer, else the server this
    script starts (--model), else the running server's own model (asked for; --address)."""
    if args.tokenizer:
        return args.tokenizer
    if args.address is None:
        return str(resolve_model_dir(args.model))
    if args.workload == "repeats":
        return args.model  # text prompts: the server tokenizes them
    path = server_model_path(args.address)
    if not Path(path, "tokenizer.json").exists():
        raise SystemExit(f"the server at {args.address} serves {path}, which is not readable here: pass --tokenizer DIR")
    log(f"prompts built with the server's tokenizer: {path}")
    return path


def server_model_path(address: str) -> str:
    """The model directory a running server serves: from its stats (ZMQ) or /v1/models (HTTP)."""
    if address.startswith("http://"):
        import json
        import urllib.request

        with urllib.request.urlopen(address.rstrip("/") + "/v1/models", timeout=30) as response:
            return json.loads(response.read())["data"][0]["root"]
    from zserve.client import Client

    with Client(address, timeout_s=30) as c:
        return c.stats()["model_path"]


def run_all(args: argparse.Namespace) -> dict:
    model_dir = tokenizer_dir(args)
    num_requests = len(build_workload(args, model_dir, 0)[0])
    offsets_s = arrival_offsets_s(num_requests, args.submit_interval_ms, args.request_rate, args.seed)
    arrivals_desc = describe_arrivals(args.submit_interval_ms, args.request_rate)
    workload_desc = build_workload(args, model_dir, 0)[1]
    if args.address is not None:
        configs = [ConfigRuns(f"running server at {args.address}", [])]
    else:
        base = shlex.split(args.server_args)
        configs = [ConfigRuns(flags.strip() or "(defaults)", base + shlex.split(flags)) for flags in (args.compare or [""])]
    title = args.title or f"{num_requests} requests, {workload_desc}; arrivals {arrivals_desc}"
    log(f"{title}\n  {len(configs)} configuration(s) x {args.repeats} repeat(s); load average {load_average()}")
    info = machine_info()
    started_s = time.time()
    servers = start_servers(model_dir, configs, args.server_log) if args.address is None else []
    addresses = [s.address for s in servers] or [args.address]
    try:
        for repeat in range(args.repeats):
            requests = build_workload(args, model_dir, repeat)[0]
            for i, (config, address) in enumerate(zip(configs, addresses, strict=True)):
                desc = f"[{i}] {config.name} (repeat {repeat + 1}/{args.repeats})"
                options = LoadOptions(args.ignore_eos, args.request_timeout_s, args.warmup_requests, desc, not args.no_progress)
                num_errors_before = len(config.errors)
                row = config.add(drive(address, requests, offsets_s, options))
                log(f"{desc}: {row['num_completed']:.0f} ok, {row['num_failed']:.0f} failed, {row['duration_s']:.1f}s, "
                    f"out {row['output_throughput']:.1f} tok/s, TTFT p99 {row['ttft.p99_ms']:.0f} ms, "
                    f"ITL p99 {row['itl.p99_ms']:.0f} ms; load average {load_average()}")
                if len(config.errors) > num_errors_before:
                    log(f"{desc}: first failure: {config.errors[num_errors_before]}")
    finally:
        for server in servers:
            server.request_stop()
        for server in servers:
            server.wait_stopped()
    info["load_average_end"] = load_average()
    table = render_table(configs, title)
    print(table, flush=True)
    report = {
        "benchmark": "bench_serving",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "title": title,
        "workload": {"kind": args.workload, "description": workload_desc, "num_requests": num_requests,
                     "arrivals": arrivals_desc, "ignore_eos": args.ignore_eos},
        "machine": info,
        "started_unix_s": started_s,
        "wall_s": time.time() - started_s,
        "repeats": args.repeats,
        "configs": [c.to_json(configs[0] if i else None) for i, c in enumerate(configs)],
        "table": table,
    }
    write_json(args.output_json, report)
    plot_runs(configs, title, args.output_png)
    log(f"wrote {args.output_json} and {args.output_png}")
    return report


def main(argv: list[str] | None = None) -> None:
    run_all(parse_args(argv))


if __name__ == "__main__":
    main()
