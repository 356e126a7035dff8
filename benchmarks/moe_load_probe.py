"""Load a MoE GGUF file in one process (a ModelRunner, --quantization gguf) and print: the load time,
the peak RSS, the runner's memory line, and one MoE layer's experts per step (1 and 8 rows),
stacked (default) or through fused_experts.py's loop (--loop):

    .venv/bin/python benchmarks/moe_load_probe.py /tmp/shaped/qwen3moe30b-q4_k_m.gguf [--loop]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testing.model_fixtures import make_runner  # noqa: E402
from zserve.launcher.gguf_model_dir import gguf_model_dir  # noqa: E402
from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels  # noqa: E402
from zserve.model_proc.layers import fused_experts  # noqa: E402
from zserve.model_proc.layers.sparse_moe import SparseMoeBlock  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--loop", action="store_true", help="the loop over expert modules, not the stacked op")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load_cpu_kernels()
    if args.loop:
        fused_experts.load_moe_experts = lambda: None
    model_dir = gguf_model_dir(args.gguf, with_tokenizer=False)
    t0 = time.perf_counter()
    runner = make_runner(model_dir, page_size=16, kv_cache_tokens=256, device="cpu", quantization="gguf")
    load_s = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{'loop' if args.loop else 'stacked'}: load {load_s:.1f} s, peak RSS {peak_gb:.2f} GiB, "
          f"kernel {runner.gemm_backend}", flush=True)
    print(f"memory: {runner.memory.summary()}", flush=True)
    blocks = [m for m in runner.model.modules() if isinstance(m, SparseMoeBlock)]
    hidden = blocks[0].gate.weight.shape[1]
    for rows in (1, 8):
        x = torch.randn(rows, hidden).to(runner.dtype)
        routes = [b.gate(x) for b in blocks]
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for block, (ids, weights) in zip(blocks, routes, strict=True):
                block.experts(x, ids, weights)
            times.append((time.perf_counter() - t) * 1e3)
        print(f"{rows} rows: every layer's experts {sorted(times)[len(times) // 2]:.1f} ms (median of {args.repeats}, "
              f"{len(blocks)} layers)", flush=True)


if __name__ == "__main__":
    main()
