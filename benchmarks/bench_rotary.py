"""The cost of RoPE per step: cos/sin for each scaling type, and rotation fused into the K/V write
(torch.ops.zserve.rope_store, full and partial rotary) against the unfused torch ops.

    .venv/bin/python benchmarks/bench_rotary.py [--repeats R]

Shapes of Phi-4-mini (24 query heads, 8 KV heads, head_dim 128, rotary 96 when partial), bf16,
at 1, 64 and 512 tokens per step; "dynamic" and "longrope" get each token's sequence length, all
distinct, as a batch of that many decodes past their thresholds (dynamic's worst case: one base per
distinct length; a prompt has one). Medians in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch

from zserve.common.model_config import RopeScaling
from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels
from zserve.model_proc.layers.rotary import RotaryEmbedding, apply_rotary

HEADS, KV_HEADS, HEAD_DIM = 24, 8, 128
SCALINGS = {
    "default": None,
    "llama3": RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
    "yarn": RopeScaling("yarn", 4.0, original_max_position_embeddings=32768),
    "dynamic": RopeScaling("dynamic", 2.0, max_position_embeddings=4096),
    "longrope": RopeScaling("longrope", 32.0, original_max_position_embeddings=4096,
                            short_factor=(1.0,) * 64, long_factor=tuple(1.0 + i for i in range(64))),
}


def median_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def rotate_and_store(qk, v, cos, sin, k_cache, v_cache, slots) -> None:
    """The unfused path (PagedAttention with a partial rotary): rotate, then write K and V."""
    rotated = apply_rotary(qk, cos, sin)
    k_cache.index_copy_(1, slots, rotated[:, HEADS:].transpose(0, 1))
    v_cache.index_copy_(1, slots, v.transpose(0, 1))


def cos_sin_row(num_tokens: int, dtype: torch.dtype, repeats: int) -> str:
    positions = torch.arange(8000, 8000 + num_tokens)
    row = [f"{num_tokens:4d} tokens"]
    for name, scaling in SCALINGS.items():
        rotary = RotaryEmbedding(HEAD_DIM, 10000.0, scaling)
        row.append(f"{name} {median_us(partial(rotary, positions, dtype, positions + 1), repeats):7.1f}")
    return "cos/sin us: " + ", ".join(row)


def store_row(num_tokens: int, dtype: torch.dtype, repeats: int, has_fused: bool) -> str:
    qk = torch.randn(num_tokens, HEADS + KV_HEADS, HEAD_DIM, dtype=dtype)
    v = torch.randn(num_tokens, KV_HEADS, HEAD_DIM, dtype=dtype)
    k_cache = torch.zeros(KV_HEADS, 4096, HEAD_DIM, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(4096)[:num_tokens]
    positions = torch.arange(num_tokens)
    cos, sin = RotaryEmbedding(HEAD_DIM, 10000.0, None)(positions, dtype)
    pcos, psin = RotaryEmbedding(HEAD_DIM, 10000.0, None, rotary_dim=96)(positions, dtype)
    full = partial(rotate_and_store, qk, v, cos, sin, k_cache, v_cache, slots)
    part = partial(rotate_and_store, qk, v, pcos, psin, k_cache, v_cache, slots)
    row = [f"unfused full {median_us(full, repeats):7.1f}", f"unfused partial {median_us(part, repeats):7.1f}"]
    if has_fused:
        c2, s2 = cos[:, 0].contiguous(), sin[:, 0].contiguous()
        fused = partial(torch.ops.zserve.rope_store, qk, v, c2, s2, k_cache, v_cache, slots, HEADS)
        row.append(f"fused full {median_us(fused, repeats):7.1f}")
        pc2, ps2 = pcos[:, 0].contiguous(), psin[:, 0].contiguous()
        fused_part = partial(torch.ops.zserve.rope_store, qk, v, pc2, ps2, k_cache, v_cache, slots, HEADS)
        row.append(f"fused partial {median_us(fused_part, repeats):7.1f}")
    return f"rotate + K/V write us, {num_tokens:4d} tokens: " + ", ".join(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    has_fused = load_cpu_kernels()
    for num_tokens in (1, 64, 512):
        print(cos_sin_row(num_tokens, torch.bfloat16, args.repeats))
    for num_tokens in (1, 64, 512):
        print(store_row(num_tokens, torch.bfloat16, args.repeats, has_fused))


if __name__ == "__main__":
    main()
