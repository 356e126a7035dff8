"""Our model code in fp16 vs transformers in fp16 on the same tiny random checkpoints (CPU).

fp16 runs on every x86-64 CPU with AVX2 + F16C: weights and KV stay fp16, the linear layers go
through the widening GEMM (fp16 -> fp32 by VCVTPH2PS in registers, fp32 sums, rounded once), and
attention and the elementwise ops through torch's own fp16 ops. The same near-tie rule as the
bf16 tests (test_model_parity_bf16.py), with fp16's 3 more mantissa bits making ties rarer.
"""

from __future__ import annotations

import pytest
import torch

from testing.model_fixtures import (
    TINY_KINDS,
    GreedyDriver,
    HfReference,
    first_divergence,
    make_runner,
    make_tiny_checkpoint,
    random_prompt,
)
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel

NEAR_TIE_ULPS = 4  # bf16 ulps of the top logit (first_divergence's unit): generous for fp16
PROMPT_LENS = (1, 5, 17, 40)
NEW_TOKENS = 24


@pytest.mark.parametrize("kind", list(TINY_KINDS))
def test_greedy_matches_transformers_fp16(tmp_path, kind):
    model_dir = make_tiny_checkpoint(tmp_path, kind)
    ref = HfReference(model_dir, dtype=torch.float16)
    runner = make_runner(model_dir, device="cpu", dtype="float16", page_size=4, kv_cache_tokens=4096)
    assert runner.dtype == torch.float16 and runner.kv_pool.dtype == torch.float16
    assert runner.gemm_backend == choose_kernel(torch.device("cpu"), torch.float16).name
    driver = GreedyDriver(runner)
    prompts = [random_prompt(n, seed=n) for n in PROMPT_LENS]
    outputs = driver.generate([driver.add(p, NEW_TOKENS, chunk_size=7 if len(p) > 7 else None) for p in prompts])
    divergences = []
    for prompt, ours in zip(prompts, outputs, strict=True):
        theirs, logits = ref.generate_with_logits(prompt, NEW_TOKENS)
        divergences.append(first_divergence(ours, theirs, logits, NEAR_TIE_ULPS))
    assert divergences.count(None) >= len(divergences) // 2, divergences
