"""The int8 GEMMs alone against the bf16 ones, on the demo model's shapes and a 1B model's, one
process, interleaved, best of N: the figures behind `auto`'s int8 choice (BENCHMARKS.md 22).

    .venv/bin/python benchmarks/bench_int8_gemm.py [--repeats 5] [--rows 1,8,32,64,512]

Columns, microseconds per call: int8_dot (zserve_int8_dot: activations quantized to int8,
VPDPBUSD or VPMADDUBSW), int4_dot (its 4-bit path, Q4_0-like codes), int8_widen (zserve_int8:
int8 widened to fp32), bf16 (zserve_bf16 where built, else zserve_widen) and onednn (oneDNN's
bf16 linear where the CPU has native bf16); then int8_dot / the faster 16-bit one. The kernels'
feature set (common/isa_features.py) and the dot instruction are printed first.
"""

from __future__ import annotations

import argparse
import time

import torch

from zserve.model_proc.kernels.cpu_isa import cpu_isa
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.weight_kernels.float_kernels import (
    OneDnnKernel,
    ZserveBf16Kernel,
    ZserveWidenKernel,
    onednn_supports,
)
from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel, ZserveInt8Kernel
from zserve.model_proc.weights.int4_weights import Int4Weight

SHAPES = [(576, 3072), (1536, 576), (576, 49152), (2048, 8192), (8192, 2048)]  # (in, out): demo gate+up, down, LM head; 1B MLP


def best_us(fn, repeats: int, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="1,8,32,64,512")
    args = parser.parse_args()
    if load_gemm_int8_dot() is None:
        raise SystemExit(f"the int8 x int8 GEMM is not built for this feature set ({cpu_isa()})")
    print(f"features {cpu_isa()}, dot products {torch.ops.zserve.gemm_int8_dot_instruction()}, {torch.get_num_threads()} threads")
    cpu = torch.device("cpu")
    float_kernel = ZserveBf16Kernel() if ZserveBf16Kernel.runs(cpu, torch.bfloat16) else ZserveWidenKernel()
    kernels = {"int8_dot": ZserveInt8DotKernel(group_size=32), "int8_widen": ZserveInt8Kernel(group_size=32), "bf16": float_kernel}
    if onednn_supports(torch.bfloat16):
        kernels["onednn"] = OneDnnKernel()
    print(f"{'(in, out)':<14}{'rows':>6}" + "".join(f"{name:>12}" for name in ["int8_dot", "int4_dot", *list(kernels)[1:]]) + f"{'dot/16-bit':>12}")
    g = torch.Generator().manual_seed(0)
    for k, n in SHAPES:
        plain = (torch.randn(k, n, generator=g) * 0.05).to(torch.bfloat16)
        packs = {name: kernel.pack(plain, None, None) for name, kernel in kernels.items()}
        codes = torch.randint(0, 16, (k, n), generator=g, dtype=torch.uint8)
        scales = torch.full((k // 32, n), 0.01)
        int4 = ZserveInt8DotKernel().pack(plain, None, Int4Weight(codes, scales, -8 * scales, 32))
        for rows in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
            calls = max(1, min(50, int(2e7 // (rows * k * n) + 1)))
            times = {name: best_us(lambda kn=kernel, p=packs[name], x=x: kn.matmul(x, p, None), args.repeats, calls)
                     for name, kernel in kernels.items()}
            int4_us = best_us(lambda x=x, w=int4: kernels["int8_dot"].matmul(x, w, None), args.repeats, calls)
            fastest_16 = min(times["bf16"], times.get("onednn", float("inf")))
            cells = [times["int8_dot"], int4_us, *(times[name] for name in list(kernels)[1:])]
            print(f"{f'{k} x {n}':<14}{rows:>6}" + "".join(f"{t:>12.0f}" for t in cells) + f"{times['int8_dot'] / fastest_16:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
