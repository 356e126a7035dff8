"""Launch to first answer, memory and one-at-a-time speed of a GGUF file served by zserve (and,
given its binary, llama.cpp's llama-server on the same file), each server started fresh per round,
the rounds interleaved:

    .venv/bin/python benchmarks/bench_gguf_start.py --gguf /tmp/llama1b-q4_k_m.gguf \
        [--llama-server ~/.cache/zserve-peer-llamacpp/llama-server] [--context 16384] [--rounds 2]

Per server and round:
  * launch to first answer: from starting the command to the end of the first completion (8 tokens),
    polled every 0.1 s (the page cache is warm after the first round; the first round is printed too);
  * memory: the summed PSS (/proc/PID/smaps_rollup) of the server's processes (the launcher and every
    descendant), sampled every 0.1 s from launch: its peak up to the first answer, and once serving
    (right after the last request), and at rest (`--rest-s` later: zserve's worker hands a large
    step's freed heap back after 1 s idle). PSS counts a mapped file's pages too, so llama.cpp's memory-mapped
    weights are in its figure, and a page two processes share is split between them;
  * one at a time: `--single` streamed completions of `--input-len` random token ids (no prefix is
    shared) and `--output-len` tokens (ignore_eos), TPOT = (latency - TTFT) / (tokens - 1), p50;
  * at once: `--burst` such requests sent together, output tokens per second (llama.cpp needs `-np` slots
    for them: `--llama-args "-np 16"`, its context then split between the slots);
  * zserve's memory line from /server_info (resident weights by form, the file's bytes by type).

Prints one table and writes `--output-json`. The CPU is named (lscpu) and the load average recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


class PssSampler:
    """The summed PSS of a process tree, every POLL_S, in a thread: its peak so far."""

    def __init__(self, root: int):
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, pss_bytes(tree_pids(self.root)))
            time.sleep(POLL_S)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def post(url: str, body: dict, timeout_s: float = 600.0) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def get(url: str, timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def first_answer(base: str, deadline_s: float) -> tuple[str, str]:
    """Poll until the server lists its model and completes a short prompt: (the model's name, the answer)."""
    while time.perf_counter() < deadline_s:
        try:
            model = get(f"{base}/v1/models")["data"][0]["id"]
            out = post(f"{base}/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 8,
                                                  "temperature": 0}, timeout_s=60)
            return model, out["choices"][0]["text"]
        except urllib.error.HTTPError as exc:
            if exc.code not in (503, 502):  # not ready yet answers 503; anything else is an error worth seeing
                raise
            time.sleep(POLL_S)
        except OSError:  # not listening yet
            time.sleep(POLL_S)
    raise TimeoutError(f"{base}: no answer before the deadline")


def streamed_tpot_ms(base: str, model: str, input_ids: list[int], output_len: int) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of one streamed completion of `input_ids`."""
    body = {"model": model, "prompt": input_ids, "max_tokens": output_len, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, chunks, tokens = None, 0, 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens", tokens)
            if event.get("choices"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    latency = time.perf_counter() - t0
    tokens = tokens or chunks
    return ttft * 1e3, (latency - ttft) / max(1, tokens - 1) * 1e3


def burst_throughput(base: str, model: str, args: argparse.Namespace, round_idx: int) -> float:
    """Output tokens per second of `args.burst` streamed requests sent at once (first byte sent to last token)."""
    rng = random.Random(1000 + round_idx)
    prompts = [[rng.randrange(1000, 40000) for _ in range(args.input_len)] for _ in range(args.burst)]
    threads = [threading.Thread(target=streamed_tpot_ms, args=(base, model, prompt, args.output_len)) for prompt in prompts]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return args.burst * args.output_len / (time.perf_counter() - t0)


@dataclass
class Round:
    server: str
    round: int
    launch_to_answer_s: float
    peak_pss_mb: float
    serving_pss_mb: float
    rest_pss_mb: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    burst_tok_s: float  # output tokens per second of `--burst` requests sent at once (0: none)
    answer: str
    memory: dict = field(default_factory=dict)


def run_server(name: str, cmd: list[str], base: str, args: argparse.Namespace, round_idx: int,
               env: dict[str, str]) -> Round:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    sampler = PssSampler(proc.pid)
    try:
        model, answer = first_answer(base, t0 + args.start_timeout_s)
        launch_s = time.perf_counter() - t0
        peak = sampler.peak
        rng = random.Random(round_idx)
        results = [streamed_tpot_ms(base, model, [rng.randrange(1000, 40000) for _ in range(args.input_len)],
                                    args.output_len) for _ in range(args.single)]
        burst_tok_s = burst_throughput(base, model, args, round_idx) if args.burst else 0.0
        serving = pss_bytes(tree_pids(proc.pid))
        time.sleep(args.rest_s)
        rest = pss_bytes(tree_pids(proc.pid))
        memory = {}
        if name != "llama.cpp":
            memory = get(f"{base}/server_info").get("memory", {})
        return Round(name, round_idx, launch_s, peak / 1e6, serving / 1e6, rest / 1e6,
                     statistics.median(r[0] for r in results), statistics.median(r[1] for r in results), burst_tok_s,
                     answer, memory)
    finally:
        sampler.stop()
        stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def commands(args: argparse.Namespace) -> list[tuple[str, list[str], str]]:
    """(name, command, base URL) of each server to run."""
    servers = []
    for variant in args.zserve_variant or ["zserve="]:
        name, _, flags = variant.partition("=")
        port = free_port()
        servers.append((name, [sys.executable, "-m", "zserve.launcher", "--model", str(args.gguf), "--port", str(port),
                               "--kv-cache-tokens", str(args.context), "--log-level", "warning",
                               *args.zserve_args.split(), *flags.split()], f"http://127.0.0.1:{port}"))
    if args.llama_server:
        port = free_port()
        threads = str(os.cpu_count() or 1)
        servers.append(("llama.cpp", [str(args.llama_server), "-m", str(args.gguf), "--port", str(port), "-c",
                                      str(args.context), "-t", threads, "-tb", threads, "--alias", "default",
                                      *args.llama_args.split()], f"http://127.0.0.1:{port}"))
    return servers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary (optional)")
    p.add_argument("--context", type=int, default=16384, help="KV tokens: zserve --kv-cache-tokens, llama.cpp -c")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--single", type=int, default=4, help="one-at-a-time requests per round")
    p.add_argument("--burst", type=int, default=0, help="requests sent at once after the single ones (0: none)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rest-s", type=float, default=2.0, help="seconds after the last request to sample PSS at rest")
    p.add_argument("--start-timeout-s", type=float, default=600.0)
    p.add_argument("--zserve-args", default="", help="extra launch_server flags")
    p.add_argument("--zserve-variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="a zserve server under NAME with these extra flags (repeatable; default: one, `zserve`)")
    p.add_argument("--llama-args", default="-np 1", help="extra llama-server flags")
    p.add_argument("--output-json", type=Path, default=Path("bench_gguf_start.json"))
    args = p.parse_args()

    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if line.startswith("Model name")), "unknown CPU")
    print(f"CPU: {cpu}; load average before: {os.getloadavg()[0]:.2f}; file {args.gguf} "
          f"({args.gguf.stat().st_size / 1e6:.1f} MB), context {args.context} tokens", flush=True)
    env = dict(os.environ)
    rounds: list[Round] = []
    for round_idx in range(args.rounds):
        for name, cmd, base in commands(args):
            result = run_server(name, cmd, base, args, round_idx, env)
            rounds.append(result)
            print(f"  round {round_idx} {name:14s} launch->answer {result.launch_to_answer_s:6.2f} s  peak PSS "
                  f"{result.peak_pss_mb:7.1f} MB  serving PSS {result.serving_pss_mb:7.1f} MB  at rest {result.rest_pss_mb:7.1f} MB  "
                  f"TTFT p50 "
                  f"{result.ttft_p50_ms:7.1f} ms  TPOT p50 {result.tpot_p50_ms:6.1f} ms  burst {result.burst_tok_s:6.1f} tok/s  "
                  f"answer {result.answer!r}",
                  flush=True)
            if result.memory:
                print(f"    zserve memory: resident weights {result.memory['resident_bytes'] / 1e6:.1f} MB for "
                      f"{result.memory['file_bytes'] / 1e6:.1f} MB on file, KV {result.memory['kv_pool_bytes'] / 1e6:.1f} MB; "
                      f"by form {json.dumps({k: round(v / 1e6, 1) for k, v in result.memory['resident_bytes_by_form'].items()})}",
                      flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    args.output_json.write_text(json.dumps({"cpu": cpu, "file": str(args.gguf), "rounds": [asdict(r) for r in rounds]},
                                           indent=1))


if __name__ == "__main__":
    main()
