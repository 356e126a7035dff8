"""The benchmark scripts run end to end on the tiny model: bench_serving writes a well-formed
table, JSON and PNG; bench_offline reports both throughputs and their ratio.

Speed is not checked here (that is what the benchmarks are for); only that the figures exist,
are consistent with the workload, and that the radix-cache comparison sees prefix hits.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from testing.paths import REPO_ROOT
from zserve.common.isa_features import IsaFeatures
from zserve.model_proc.kernels.cpu_kernels import load_paged_attention

REPO = REPO_ROOT
SERVER_ARGS = "--log-level warning --kv-cache-tokens 8192 --num-threads 1 --max-running-requests 8"


def run_bench(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_serving.py"), "--server-args", SERVER_ARGS, "--no-progress", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return proc


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_compare_two_configs_with_repeats(model_dir, tmp_path):
    out = tmp_path / "serving.json"
    proc = run_bench(
        "--model", str(model_dir), "--num-requests", "6", "--prompt-repeats", "1,3", "--unique-prompts", "--max-tokens", "4",
        "--submit-interval-ms", "10", "--compare", "", "--chunked-prefill-size 16", "--repeats", "2",
        "--warmup-requests", "1", "--output-json", str(out),
    )
    assert "TTFT p99 (ms)" in proc.stdout and "[1]/[0]" in proc.stdout
    report = json.loads(out.read_text())
    assert report["workload"]["num_requests"] == 6 and report["repeats"] == 2
    base, other = report["configs"]
    assert base["ratio_to_baseline"] is None and other["ratio_to_baseline"]["output_throughput"] > 0
    assert other["server_flags"][-2:] == ["--chunked-prefill-size", "16"]
    for config in report["configs"]:
        assert len(config["runs"]) == 2
        for run in config["runs"]:
            assert run["num_completed"] == 6 and run["num_failed"] == 0
            assert run["num_output_tokens"] == 6 * 4  # --ignore-eos is the default
            for name in ("ttft", "tpot", "itl", "latency"):
                assert 0 < run[f"{name}.p50_ms"] <= run[f"{name}.p95_ms"] <= run[f"{name}.p99_ms"]
            assert run["ttft.p99_ms"] <= run["latency.p99_ms"]
            assert run["output_throughput"] > 0 and run["total_throughput"] > run["output_throughput"]
        assert config["median"]["num_completed"] == 6
    width, height = png_size(tmp_path / "serving.png")
    assert width > 500 and height > 400


def test_shared_prefix_with_and_without_radix_cache(model_dir, tmp_path):
    out = tmp_path / "prefix.json"
    run_bench(
        "--model", str(model_dir), "--workload", "shared-prefix", "--num-groups", "2", "--prompts-per-group", "3",
        "--system-prompt-len", "64", "--question-len", "4", "--max-tokens", "3", "--request-rate", "50",
        "--compare", "", "--disable-radix-cache", "--output-json", str(out), "--output-png", str(tmp_path / "p.png"),
    )
    report = json.loads(out.read_text())
    cached, uncached = (c["median"] for c in report["configs"])
    assert cached["num_completed"] == uncached["num_completed"] == 6
    assert cached["prefix_hit_rate"] > 0.3  # 4 of 6 requests find their group's 64-token prefix
    assert uncached["prefix_hit_rate"] == 0
    png_size(tmp_path / "p.png")


def test_offline_reports_both_throughputs_and_the_ratio(model_dir, tmp_path):
    out = tmp_path / "offline.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "bench_offline.py"), "--model", str(model_dir), "--num-requests", "6",
        "--input-len", "40", "--min-input-len", "8", "--output-len", "6", "--min-output-len", "2",
        "--server-args", SERVER_ARGS,
        "--hf-batch-sizes", "2,4", "--hf-search-requests", "4", "--hf-threads", "1", "--output-json", str(out), "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "zserve / transformers" in proc.stdout and "float32 on both sides" in proc.stdout
    report = json.loads(out.read_text())
    assert report["dtype"] == "float32" and "--dtype float32" in proc.stderr  # zserve ran the dtype transformers ran
    workload, zserve, hf = report["workload"], report["zserve"], report["transformers"]
    assert zserve["num_completed"] == 6 and zserve["num_output_tokens"] == workload["num_output_tokens"]
    assert 6 * 2 <= workload["num_output_tokens"] <= 6 * 6
    assert hf["num_output_tokens"] == workload["num_output_tokens"] and hf["batch_size"] in (2, 4)
    assert [run["batch_size"] for run in hf["search"]] == [2, 4]
    assert report["ratio_output_throughput"] > 0
    assert report["ratio_output_throughput"] == zserve["output_throughput"] / hf["output_throughput"]


def test_bench_engine_generate_runs_a_batch_past_the_queue_cap_in_order(model_dir, tmp_path):
    out = tmp_path / "engine.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "bench_engine_generate.py"), "--model", str(model_dir), "--num-prompts", "30",
        "--max-tokens", "2", "--server-args", SERVER_ARGS + " --max-queued-requests 4", "--output-json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "30 prompts x 2 tokens" in proc.stdout and "in prompt order: yes" in proc.stdout
    assert "30/30" in proc.stderr  # the progress bar
    report = json.loads(out.read_text())
    assert report["max_in_flight"] == 4 and report["num_output_tokens"] == 60 and report["num_misplaced"] == 0
    assert report["output_tokens_per_s"] > 0


def test_bench_admission_reports_runs_and_compares_outputs(model_dir, tmp_path):
    """Identical prompts on two configurations, outputs compared with the last one: every figure is
    there, nothing failed, nothing is left allocated at idle, the outputs agree."""
    out = tmp_path / "admission.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "bench_admission.py"), "--model", str(model_dir), "--scenario", "identical",
        "--num-requests", "4", "--input-len", "24", "--output-len", "4", "--server-args", SERVER_ARGS,
        "--compare", "", "--disable-radix-cache", "--reference", "last", "--output-json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "| --disable-radix-cache | 0 |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == ["", "--disable-radix-cache"]
    for row in rows:
        assert row["errors"] == 0 and row["output_tokens"] == 4 * 4 and row["outputs_differing"] == 0
        assert row["used_pages_at_idle"] == 0 and row["reserved_pages_at_idle"] == 0
        assert row["peak_running"] <= 4 and row["prefilled_tokens"] >= 24  # 4-token runs may end between polls
    # no cache: the copies that reach one admission round together compute their prompt once, so
    # once per round the burst reached the scheduler in (timing decides: 1 to 4)
    assert rows[1]["prefilled_tokens"] in (24, 2 * 24, 3 * 24, 4 * 24)


def test_bench_attention_compares_both_paths(model_dir):
    """Layer cases and whole decode steps, each with both paths' times and their ratio; the
    sliding-window case (window 1024, context 4096) with the window's and full attention's."""
    if load_paged_attention() is None:
        pytest.skip("the CPU paged-attention kernel did not build here")
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_attention.py"), "--quick", "--repeats", "1", "--dtype", "float32", "--model", str(model_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines() if line.startswith(("decode_", "step_"))}
    assert set(rows) == {"decode_bs1_ctx256", "decode_bs64_ctx256", "decode_bs1_ctx1024", "decode_bs64_ctx1024", "decode_bs1_ctx4096", "step_bs1_ctx256", "step_bs8_ctx256"}
    for kernel_ms, torch_ms, ratio in rows.values():
        k, t = float(kernel_ms), float(torch_ms)
        rounding = 0.005 * (1 / t + k / t**2)  # the times are printed to 0.01 ms; the ratio is of the unrounded times
        assert k > 0 and t > 0 and abs(float(ratio) - k / t) < 0.01 + rounding


def test_bench_cpu_paths_times_every_variant(model_dir):
    """Every distinct variant on every case, with its ratio to the first (torch)."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_cpu_paths.py"), "--repeats", "1", "--batch-sizes", "1,2", "--model", str(model_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    header = next(line for line in proc.stdout.splitlines() if line.startswith("case"))
    assert "torch (torch)" in header and "default" in header
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("decode_", "prefill_"))]
    assert [r[0] for r in rows] == ["decode_bs1", "decode_bs2", "prefill_512"]
    for row in rows:
        times = [float(x) for x, unit in zip(row[1::2], row[2::2], strict=False) if unit == "ms"]
        ratios = [float(x) for x in row[1 + 2 * len(times):]]
        assert len(times) == len(ratios) >= 2 and ratios[0] == 1.0 and all(t > 0 for t in times)


def test_against_a_running_server_the_prompts_use_its_tokenizer_and_failures_are_named(model_dir, tmp_path):
    """--address: random prompts come from the server's own tokenizer (asked for through stats),
    and a run whose requests fail says why on the console."""
    from testing.server_process import start_server

    server = start_server(model_dir, "--kv-cache-tokens", "4096", "--num-threads", "1", "--context-length", "64")
    try:
        common = ("--address", server.address, "--workload", "random", "--num-requests", "2", "--warmup-requests", "0",
                  "--request-rate", "inf")
        proc = run_bench(*common, "--input-len", "16", "--output-len", "4", "--output-json", str(tmp_path / "ok.json"))
        assert f"prompts built with the server's tokenizer: {Path(model_dir).resolve()}" in proc.stderr + proc.stdout
        assert "2 ok, 0 failed" in proc.stderr + proc.stdout
        proc = run_bench(*common, "--input-len", "100", "--output-len", "4", "--output-json", str(tmp_path / "bad.json"))
        out = proc.stderr + proc.stdout
        assert "0 ok, 2 failed" in out and "first failure: InvalidRequestError" in out and "context" in out, out
    finally:
        assert server.stop() == 0


def test_bench_structured_runs_schema_and_free_at_equal_lengths(model_dir, tmp_path):
    out = tmp_path / "structured.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "bench_structured.py"), "--model", str(model_dir), "--num-requests", "4",
        "--max-tokens", "60", "--repeats", "2", "--server-args", SERVER_ARGS, "--output-json", str(out), "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "median ratio (schema / free output throughput)" in proc.stdout
    report = json.loads(out.read_text())
    assert len(report["repeats"]) == 2
    for pair in report["repeats"]:
        assert pair["schema"]["num_completed"] == pair["free"]["num_completed"] == 4
        assert pair["schema"]["num_output_tokens"] == pair["free"]["num_output_tokens"] == pair["num_output_tokens"] > 0
        assert pair["ratio_output_throughput"] == pair["schema"]["output_throughput"] / pair["free"]["output_throughput"]


def test_bench_step_path_breaks_down_a_served_token(model_dir, tmp_path):
    """Step alone, the scheduler's wait and own time per decode step, TPOT through ZMQ and HTTP:
    all present, positive, and the wait per decode step comes out about a served TPOT or less.
    The wait of a separate prefill is subtracted from the request's: 64 output tokens keep the decode
    steps far above that estimate's noise on a fast CPU (with 12, 11 steps of ~3 ms on an AVX512-BF16
    machine once came out 7 ms below one noisy prefill: a negative wait)."""
    out = tmp_path / "step_path.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_step_path.py"), "--model", str(model_dir), "--dtype", "float32",
           "--requests", "1", "--repeats", "1", "--input-len", "16", "--output-len", "64", "--output-json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    report = json.loads(out.read_text())
    row = report["rows"][0]
    assert row["alone_ms"] > 0 and IsaFeatures.parse(report["machine"]["cpu_isa"]).name == report["machine"]["cpu_isa"]
    for door in ("zmq", "http"):
        # per decode step, a part of one TPOT: within 2x, as the prefill subtracted from the waits is another
        # request's (on a loaded machine it came out 1% above a 10 ms TPOT once); a total or a unit slip is 10x off
        assert 0 < row[door]["wait_ms"] < 2 * row[door]["tpot_ms"] and row[door]["schedule_ms"] > 0, row
    assert "TPOT" in proc.stdout and "step alone" in proc.stdout


def test_bench_overlap_measures_both_settings(model_dir, tmp_path):
    """Overlap on and off, each: a TPOT, the scheduler's own time per step, and a burst's throughput; with overlap
    the scheduler's time between a result and the next send is (nearly) gone: the next batch was sent ahead."""
    out = tmp_path / "overlap.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_overlap.py"), "--model", str(model_dir), "--dtype", "float32",
           "--requests", "1", "--repeats", "1", "--input-len", "16", "--output-len", "48", "--burst", "4",
           "--burst-input-len", "8", "--burst-output-len", "16", "--output-json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    row = json.loads(out.read_text())["rows"][0]
    assert row["alone_ms"] > 0
    for name in ("on", "off"):
        assert row[name]["tpot_ms"] > 0 and row[f"burst_{name}"]["output_tok_s"] > 0, row
    assert row["on"]["schedule_ms"] < row["off"]["schedule_ms"], row
    assert "TPOT on" in proc.stdout and "at once" in proc.stdout


def test_bench_containment_prints_every_case():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_containment.py"), "--tries", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if "refused in" in line]
    assert [line.split("  ")[0] for line in lines] == [
        "zmq input_ids 1M", "zmq messages 100k", "http /v1/completions 1M ids", "http /generate 1M ids", "http /v1/chat 100k messages",
    ]
    assert all("added" in line for line in lines)
