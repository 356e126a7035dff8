"""The int8 x int8 GEMM with its rows in AMX tiles (TDPBSUD, kernels/gemm_amx.cpp) against the same
kernel's vector path (VPDPBUSD zmm), its bf16 tiles (bf16 x of 256 rows and more decoded to bf16 per chunk for
oneDNN, kernels/bf16_tiles.cpp, where the CPU has AMX-BF16: column `tiles`) and oneDNN's bf16 matmul on a kept
bf16 copy (AMX-BF16 where the CPU has it), on a
1B model's MLP shapes (K = 2048: N = 8192 and 2048) and a Q4_K-like 4-bit weight (nibbles, groups of
32, compact scales and offsets are not needed for the timing: fp32 scales and offsets).

    .venv/bin/python benchmarks/bench_amx_gemm.py [--rounds 5] [--rows 16,64,256]

The vector path runs in a child process whose ZSERVE_CPU_ISA leaves amx_int8 out (`--vector-isa`,
default avx512+avx512_vnni: the lower set tests/model/test_cpu_isa.py builds), the AMX path and oneDNN
in a child at this CPU's full set; the children alternate, one round each at a time, and the figures
are the medians over the rounds of each child's best of `--repeats`. Milliseconds per call, `--threads`
threads (default 2; 1 measures the kernels alone where other processes share the CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

K = 2048
OUT_FEATURES = (8192, 2048)


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def worker(rows: list[int], repeats: int, with_onednn: bool) -> None:
    import torch

    from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot

    assert load_gemm_int8_dot() is not None, "no int8 dot kernel in this build"
    g = torch.Generator().manual_seed(0)
    results = {"instruction": torch.ops.zserve.gemm_int8_dot_instruction(),
               "bf16_tile_rows": torch.ops.zserve.gemm_int8_dot_bf16_tile_rows(), "ms": {}}
    for n in OUT_FEATURES:
        blocks = n // 16
        codes = torch.randint(0, 256, (blocks, K // 8, 16, 4), dtype=torch.uint8, generator=g)
        scales = torch.rand(blocks, K // 32, 16, generator=g) * 0.01
        offsets = torch.randn(blocks, K // 32, 16, generator=g) * 0.01
        w_bf16 = torch.randn(K, n, generator=g).bfloat16()
        for m in rows:
            x = torch.randn(m, K, generator=g).bfloat16()
            weights = (codes, scales, offsets, n)

            def int4_dot(x_in, w=weights):
                return torch.ops.zserve.gemm_int4_dot(x_in, w[0], w[1], w[2], w[3], None, 32)

            # fp16 x: always the int8 contract (AMX-INT8 tiles from 16 rows in the amx child); bf16 x: bf16 tiles
            # from BF16_TILE_MIN_ROWS rows where the CPU has AMX-BF16 (kernels/bf16_tiles.cpp), the int8 path below
            results["ms"][f"int4_dot {m}x{K}x{n}"] = best_ms(lambda x=x.half(): int4_dot(x), repeats)
            if with_onednn:
                results["ms"][f"int4_dot_bf16 {m}x{K}x{n}"] = best_ms(lambda x=x: int4_dot(x), repeats)
                results["ms"][f"onednn_bf16 {m}x{K}x{n}"] = best_ms(lambda x=x, w=w_bf16: x @ w, repeats)
    print("RESULT " + json.dumps(results), flush=True)


def run_child(isa: str | None, rows: list[int], repeats: int, threads: int, with_onednn: bool) -> dict:
    env = dict(os.environ)
    if isa is not None:
        env["ZSERVE_CPU_ISA"] = isa
    cmd = [sys.executable, __file__, "--worker", "--rows", ",".join(map(str, rows)), "--repeats", str(repeats),
           "--threads", str(threads)]
    if with_onednn:
        cmd.append("--onednn")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=1800).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="16,64,256")
    parser.add_argument("--vector-isa", default="avx512+avx512_vnni")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--onednn", action="store_true")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        worker(rows, args.repeats, args.onednn)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine_info import load_average, machine_info

    info = machine_info()
    print(f"# {info.get('cpu')} (family/model {info.get('cpu_family_model')}), {args.threads} threads, load before {load_average()}")
    runs: dict[str, list[dict]] = {"amx": [], "vector": []}
    for _ in range(args.rounds):
        runs["amx"].append(run_child(None, rows, args.repeats, args.threads, with_onednn=True))
        runs["vector"].append(run_child(args.vector_isa, rows, args.repeats, args.threads, with_onednn=False))
    print(f"# amx child: {runs['amx'][0]['instruction']}; vector child ({args.vector_isa}): {runs['vector'][0]['instruction']}")
    print(f"# load after {load_average()}; medians of {args.rounds} rounds, each the best of {args.repeats}")
    tiles_from = runs["amx"][0]["bf16_tile_rows"]
    print(f"# bf16 tiles (bf16 x): {f'from {tiles_from} rows' if tiles_from else 'none in this build or on this CPU'}")
    print(f"{'M x K x N':>18} {'amx ms':>9} {'vector ms':>10} {'tiles ms':>9} {'onednn bf16 ms':>15} {'vector/amx':>11} "
          f"{'amx/tiles':>10} {'onednn/amx':>11}")
    for n in OUT_FEATURES:
        for m in rows:
            shape = f"{m}x{K}x{n}"

            def med(kind: str, name: str, shape: str = shape) -> float:
                return statistics.median(r["ms"][f"{name} {shape}"] for r in runs[kind])

            amx, vector, onednn = med("amx", "int4_dot"), med("vector", "int4_dot"), med("amx", "onednn_bf16")
            tiles = med("amx", "int4_dot_bf16")
            print(f"{shape:>18} {amx:9.2f} {vector:10.2f} {tiles:9.2f} {onednn:15.2f} {vector / amx:11.2f} {amx / tiles:10.2f} "
                  f"{onednn / amx:11.2f}")


if __name__ == "__main__":
    main()
