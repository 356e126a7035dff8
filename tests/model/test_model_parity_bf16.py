"""Our model code in bf16 vs transformers in bf16 on the same tiny random checkpoints (CPU).

bf16 keeps 8 significant bits, so two kernels that add the same products in another order can
round a logit one ulp apart, and when transformers' top two logits are that close, greedy picks
differently. So, on every path (whole prompt, chunks, prefix hit, decode, mixed batches):

  * greedy token ids equal transformers' up to the first near-tie: a token may differ only where
    transformers' own logits put ours less than NEAR_TIE_ULPS bf16 ulps (of the top logit)
    below its top one; the texts differ after that, so the rest is not compared
    (`first_divergence`). Everywhere else, equal.
  * last-position logits within LOGITS_ATOL of transformers' bf16 ones.

Both are 4 bf16 ulps at the scale of these models' top logits (|logit| in [2, 4): ulp 2^-6 =
0.0156), twice the largest difference measured.
Measured (2026-11-24, the default CPU path: attention kernel, our bf16 GEMM, fused ops, and the
same with ZSERVE_GEMM=torch ZSERVE_FUSED_OPS=off): last-position logits after a 40-token prefill
within 0.016-0.033 of transformers' bf16 ones on every tiny kind, against 0.025-0.055 between
transformers' own bf16 and fp32 logits. Greedy runs left transformers' at tokens 0.0-0.031
apart in its logits. The fp32 tests (test_model_parity.py)
stay token-exact.
"""

from __future__ import annotations

import functools

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
from zserve.model_proc.kernels.cpu_isa import cpu_isa
from zserve.model_proc.layers import attention_metadata
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel

NEAR_TIE_ULPS = 4  # of the top logit; the tiny models' top logits lie in [2, 4), where a bf16 ulp is 2^-6
LOGITS_ATOL = NEAR_TIE_ULPS * 2.0**-6
PROMPT_LENS = (1, 5, 17, 40)
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> (model_dir, bf16 reference with memoised greedy outputs and logits)."""

    @functools.cache
    def get(kind: str):
        model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(kind), kind)
        return model_dir, _MemoReference(HfReference(model_dir, dtype=torch.bfloat16))

    return get


class _MemoReference:
    def __init__(self, ref: HfReference):
        self.ref = ref
        self._generate = functools.cache(lambda prompt: ref.generate_with_logits(list(prompt), NEW_TOKENS))

    def check(self, prompt: list[int], ours: list[int]) -> int | None:
        """Where `ours` leaves transformers' greedy tokens (at a near-tie only), or None."""
        theirs, logits = self._generate(tuple(prompt))
        return first_divergence(ours, theirs, logits, NEAR_TIE_ULPS)


def bf16_runner(model_dir, page_size: int = 4):
    return make_runner(model_dir, device="cpu", dtype="bfloat16", page_size=page_size, kv_cache_tokens=4096)


def prompts(lens=PROMPT_LENS) -> list[list[int]]:
    return [random_prompt(n, seed=n) for n in lens]


@pytest.mark.parametrize("kind", list(TINY_KINDS))
def test_greedy_matches_transformers_bf16(checkpoints, kind):
    model_dir, ref = checkpoints(kind)
    runner = bf16_runner(model_dir)
    assert runner.dtype == torch.bfloat16 and runner.kv_pool.dtype == torch.bfloat16
    driver = GreedyDriver(runner)
    outputs = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts()])
    divergences = [ref.check(prompt, out) for prompt, out in zip(prompts(), outputs, strict=True)]
    # near-ties are rare: most runs match to the end (guards against a check that excuses everything)
    assert divergences.count(None) >= len(divergences) // 2, divergences


@pytest.mark.parametrize("chunk_size", [3, 7])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gpt2", "qwen3_moe", "mixtral"])
def test_chunked_prefill_bf16(checkpoints, kind, chunk_size):
    model_dir, ref = checkpoints(kind)
    driver = GreedyDriver(bf16_runner(model_dir))
    outputs = driver.generate([driver.add(p, NEW_TOKENS, chunk_size=chunk_size) for p in prompts((17, 40))])
    for prompt, out in zip(prompts((17, 40)), outputs, strict=True):
        ref.check(prompt, out)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2", "mistral", "mixtral"])
def test_prefix_hit_bf16(checkpoints, kind, page_size):
    """B's first 20 tokens come from the bf16 pages A wrote."""
    model_dir, ref = checkpoints(kind)
    driver = GreedyDriver(bf16_runner(model_dir, page_size))
    a_prompt = random_prompt(40, seed=7)
    b_prompt = a_prompt[:20] + random_prompt(13, seed=8)
    a = driver.add(a_prompt, NEW_TOKENS)
    ref.check(a_prompt, driver.generate([a])[0])
    b = driver.add(b_prompt, NEW_TOKENS, prefix_of=a, prefix_len=20)
    assert b.cached_len == (20 // page_size) * page_size > 0
    ref.check(b_prompt, driver.generate([b])[0])


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2", "qwen3_moe", "mixtral"])
def test_mixed_batches_and_decode_chunks_bf16(checkpoints, kind, monkeypatch):
    """Requests arrive one per step, so forwards mix prefills, chunks and decodes; decode rows
    attend one row per chunk."""
    monkeypatch.setattr(attention_metadata, "DECODE_CHUNK_BYTES", 1)
    model_dir, ref = checkpoints(kind)
    driver = GreedyDriver(bf16_runner(model_dir))
    lens, chunks = (3, 29, 1, 11, 40), (None, 6, None, 4, 9)
    pending = [driver.add(p, NEW_TOKENS, chunk_size=c) for p, c in zip(prompts(lens), chunks, strict=True)]
    running = []
    while pending or not all(s.done for s in running):
        if pending:
            running.append(pending.pop(0))
        driver.step([s for s in running if not s.done])
    for seq in running:
        ref.check(seq.prompt, seq.output_ids)


@pytest.mark.parametrize("kind", list(TINY_KINDS))
def test_last_logits_close_bf16(checkpoints, kind):
    """After a prefill, a chunk (over cached bf16 pages) and a decode step."""
    model_dir, ref = checkpoints(kind)
    runner = bf16_runner(model_dir)
    driver = GreedyDriver(runner)
    seq = driver.add(random_prompt(23, seed=3), 3, chunk_size=15)
    for expect_len in (15, 23, 24):
        batch = driver.build_batch([seq])
        ours = runner.last_logits(batch)[0]
        seq.cached_len += int(batch.extend_lens[0])
        theirs = ref.ref.last_logits(seq.tokens[: seq.cached_len])
        assert seq.cached_len == expect_len and ours.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, atol=LOGITS_ATOL, rtol=0)
        if seq.cached_len == len(seq.tokens):
            seq.tokens.append(int(ours.argmax()))


@pytest.mark.parametrize("gemm", ["auto", "zserve_bf16", "zserve_widen", "onednn", "torch"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_every_gemm_backend_bf16(checkpoints, kind, gemm, monkeypatch):
    """The linear layers' GEMM (model_proc/layers/weight_kernels/: our kernels by default where they
    build, oneDNN-packed where the CPU has native bf16, plain torch.mm) keeps greedy parity;
    qwen2 and gpt2 bring biases."""
    expected = choose_kernel(torch.device("cpu"), torch.bfloat16, gemm).name
    if gemm != "auto" and expected != gemm:
        pytest.skip(f"{gemm} does not run bf16 at this process's level ({cpu_isa()}): {expected} would")
    monkeypatch.setenv("ZSERVE_GEMM", gemm)
    model_dir, ref = checkpoints(kind)
    runner = bf16_runner(model_dir)
    assert runner.gemm_backend == expected
    driver = GreedyDriver(runner)
    outputs = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts()])
    divergences = [ref.check(prompt, out) for prompt, out in zip(prompts(), outputs, strict=True)]
    assert divergences.count(None) >= len(divergences) // 2, divergences
