"""Resident weights against the file, and Q6_K's 6-bit codes against int8 codes, for GGUF files:

    .venv/bin/python benchmarks/bench_six_bit.py --memory /tmp/shaped/llama1b-q4_k_m.gguf /tmp/shaped/llama1b-q4_0.gguf
    .venv/bin/python benchmarks/bench_six_bit.py --speed /tmp/shaped/llama1b-q4_k_m.gguf [--repeats 15]

--memory: each file loaded by a ModelRunner in turn (--quantization gguf, a small KV pool), its memory
line printed (resident weights by form, the file's tensor bytes by type) with resident / file.

--speed: the file loaded twice in one process; in the second runner every 6-bit weight (Q6_K, kernels/
six_bit_codes.h) is expanded to int8 quads with the same fp16 x int8 scales (zserve::six_bit_quads: the
layout main keeps Q6_K in), then one decode step at batch 1 and 8 (256 tokens of context) and a
128-token prefill are timed on both, alternately (bench_model.timed_alternately), and the medians and
their ratio printed with the load average. The embedding lookup is the same on both sides.
Runs in the model worker's environment (common/worker_env.py), as bench_model.py.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_model import PAGE_SIZE, decode_batch, prefill_batch, timed_alternately  # noqa: E402
from benchmarks.machine_info import load_average  # noqa: E402
from testing.model_fixtures import make_runner  # noqa: E402
from zserve.common.worker_env import worker_env  # noqa: E402
from zserve.launcher.gguf_model_dir import gguf_model_dir  # noqa: E402
from zserve.model_proc.layers.gemm import GemmWeight  # noqa: E402
from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight  # noqa: E402

CONTEXT_LEN = 256


def runner(gguf: str, kv_tokens: int):
    model_dir = str(gguf_model_dir(Path(gguf), with_tokenizer=False))
    return make_runner(model_dir, device="cpu", dtype=torch.bfloat16, page_size=PAGE_SIZE, kv_cache_tokens=kv_tokens,
                       num_threads=0, quantization="gguf")


def as_int8_quads(packed: PackedWeight) -> tuple[PackedWeight, int]:
    """`packed` with its 6-bit codes (pieces too) as int8 quads; and how many it changed."""
    if packed.pieces:
        pieces = [as_int8_quads(p) for p in packed.pieces]
        return replace(packed, pieces=tuple(p for p, _ in pieces)), sum(n for _, n in pieces)
    if packed.bits != 6:
        return packed, 0
    return replace(packed, values=torch.ops.zserve.six_bit_quads(packed.values), bits=8), 1


def memory(files: list[str]) -> None:
    for gguf in files:
        r = runner(gguf, kv_tokens=256)
        m = r.memory
        print(f"{Path(gguf).name}: resident {m.resident_bytes / 1e6:.1f} MB / file {m.file_bytes / 1e6:.1f} MB = "
              f"{m.resident_bytes / m.file_bytes:.3f}x\n  {m.summary()}", flush=True)
        del r
        gc.collect()


def speed(gguf: str, repeats: int) -> None:
    kv_tokens = 8 * (CONTEXT_LEN + PAGE_SIZE) + 128
    six, quads = runner(gguf, kv_tokens), runner(gguf, kv_tokens)
    changed = 0
    for module in quads.model.modules():
        if isinstance(module, GemmWeight) and module.packed is not None:
            module.packed, n = as_int8_quads(module.packed)
            changed += n
    for pool in (six.kv_pool, quads.kv_pool):
        for t in pool.k + pool.v:
            t.normal_()
    print(f"{Path(gguf).name}: {changed} weights with 6-bit codes; resident {six.memory.resident_bytes / 1e6:.1f} MB "
          f"(file {six.memory.file_bytes / 1e6:.1f} MB); CPU threads {torch.get_num_threads()}; load average {load_average()}")
    print(f"{'case':<22}{'6-bit ms':>10}{'int8 ms':>10}{'6-bit/int8':>12}")
    cases = [(f"decode_bs{b}_ctx{CONTEXT_LEN}", decode_batch(b, CONTEXT_LEN, step_id=b)) for b in (1, 8)]
    cases.append(("prefill_128", prefill_batch(128, step_id=100)))
    for case, batch in cases:
        six_ms, quads_ms = timed_alternately([lambda b=batch: six.run(b), lambda b=batch: quads.run(b)], repeats)
        print(f"{case:<22}{six_ms:>10.2f}{quads_ms:>10.2f}{six_ms / quads_ms:>12.3f}", flush=True)
    print(f"load average after: {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memory", nargs="*", default=[], help="GGUF files: print each one's memory line")
    parser.add_argument("--speed", default=None, help="a GGUF file with Q6_K tensors: 6-bit against int8 codes")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if "ZSERVE_NUM_THREADS" not in os.environ:  # the model worker's threads, OpenMP and malloc settings (read at start)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **worker_env(args.threads, "cpu")})
    memory(args.memory)
    if args.speed:
        speed(args.speed, args.repeats)


if __name__ == "__main__":
    main()
