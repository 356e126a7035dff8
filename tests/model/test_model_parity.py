"""Our model code vs transformers on tiny random checkpoints of every architecture, fp32 on CPU:
greedy token ids identical, last-position logits within 1e-4, whatever way the tokens reach
the worker (whole prompt, chunks, prefix hit, mixed batches, page sizes).

Runners take the default attention path (the CPU kernel where it builds); tests parametrized on
`attention` run once on each path, so the pure-torch fallback stays tested too."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from testing.model_fixtures import (
    TINY_KINDS,
    GreedyDriver,
    HfReference,
    make_runner,
    make_tiny_checkpoint,
    random_prompt,
)
from zserve.common.forward_batch import NO_TOKEN, SamplingArrays
from zserve.model_proc.kernels.cpu_kernels import load_paged_attention
from zserve.model_proc.layers import attention_metadata
from zserve.model_proc.model_runner import ModelRunner

PROMPT_LENS = (1, 5, 17, 40)
NEW_TOKENS = 32
LOGITS_ATOL = 1e-4
ROPE_KINDS = ["llama_yarn", "llama_dynamic", "phi3", "phi4_partial"]  # RoPE scalings, Phi-3, partial rotary
VARIANTS = {  # checkpoint name -> (kind, make_tiny_checkpoint options)
    **{kind: (kind, {}) for kind in TINY_KINDS},
    "llama_sharded": ("llama", {"num_shards": 3}),
    "qwen3_bf16": ("qwen3", {"stored_dtype": "bfloat16"}),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (model_dir, HfReference with memoised greedy outputs), built on first use."""

    @functools.cache
    def get(name: str):
        kind, options = VARIANTS[name]
        model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(name), kind, **options)
        return model_dir, _MemoReference(HfReference(model_dir))

    return get


class _MemoReference:
    def __init__(self, ref: HfReference):
        self.ref = ref
        self.generate = functools.cache(lambda prompt, n: ref.generate(list(prompt), n))

    def greedy(self, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
        return self.generate(tuple(prompt), n)


@pytest.fixture(autouse=True)
def attention_path(request, monkeypatch):
    """Sets ZSERVE_ATTENTION for tests parametrized on `attention` ("kernel" or "torch")."""
    callspec = getattr(request.node, "callspec", None)
    choice = callspec.params.get("attention") if callspec else None
    if choice == "kernel" and load_paged_attention() is None:
        pytest.skip("the CPU paged-attention kernel did not build here")
    if choice:
        monkeypatch.setenv("ZSERVE_ATTENTION", choice)


BOTH_PATHS = pytest.mark.parametrize("attention", ["kernel", "torch"])
# the kinds each scenario runs on (every kind runs greedy generation and last logits)
CHUNKED_KINDS = [
    "llama", "llama3_rope", "qwen2", "qwen3", "gpt2", "mistral_window", "qwen2_window", "gemma3", "qwen3_moe", "mixtral",
    *ROPE_KINDS,
]
PREFIX_HIT_KINDS = [
    "llama", "qwen3", "gpt2", "mistral", "mistral_window", "qwen2_window", "gemma3", "qwen3_moe", *ROPE_KINDS,
]
MIXED_BATCH_KINDS = [
    "llama", "qwen2", "qwen3", "gpt2", "llama_tied", "mistral_window", "qwen2_window", "gemma2", "qwen3_moe", "mixtral",
    "qwen2_moe", *ROPE_KINDS,
]


def parity_runner(model_dir, page_size: int = 4) -> ModelRunner:
    return make_runner(model_dir, device="cpu", dtype="float32", page_size=page_size, kv_cache_tokens=4096)


def prompts(lens=PROMPT_LENS) -> list[list[int]]:
    return [random_prompt(n, seed=n) for n in lens]


@BOTH_PATHS
@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_matches_transformers_generate(checkpoints, name, attention):
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir))
    ours = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts()])
    for prompt, out in zip(prompts(), ours, strict=True):
        assert out == ref.greedy(prompt), f"{name}: prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
@pytest.mark.parametrize("name", CHUNKED_KINDS)
def test_chunked_prefill(checkpoints, name, chunk_size):
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir))
    ours = driver.generate([driver.add(p, NEW_TOKENS, chunk_size=chunk_size) for p in prompts((5, 17, 40))])
    for prompt, out in zip(prompts((5, 17, 40)), ours, strict=True):
        assert out == ref.greedy(prompt)


@BOTH_PATHS
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("name", PREFIX_HIT_KINDS)
def test_prefix_hit(checkpoints, name, page_size, attention):
    """B's first half comes from the pages A wrote (whole pages only, as a radix cache shares them)."""
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir, page_size))
    a_prompt = random_prompt(40, seed=7)
    b_prompt = a_prompt[:20] + random_prompt(13, seed=8)
    a = driver.add(a_prompt, NEW_TOKENS)
    assert driver.generate([a])[0] == ref.greedy(a_prompt)
    b = driver.add(b_prompt, NEW_TOKENS, prefix_of=a, prefix_len=20)
    assert b.cached_len == (20 // page_size) * page_size > 0
    assert driver.generate([b])[0] == ref.greedy(b_prompt)
    c = driver.add(a_prompt + a.output_ids[:5], NEW_TOKENS, prefix_of=a, prefix_len=45)  # hit past the prompt
    assert driver.generate([c])[0] == ref.greedy(a_prompt + a.output_ids[:5])


@BOTH_PATHS
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", MIXED_BATCH_KINDS)
def test_mixed_batches(checkpoints, name, page_size, attention):
    """8 requests of different lengths arrive over time, so every forward mixes whole prefills,
    chunks and decodes."""
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir, page_size))
    lens = (3, 29, 1, 11, 40, 7, 18, 2)
    chunks = (None, 6, None, 4, 9, None, 5, None)
    pending = [driver.add(p, NEW_TOKENS, chunk_size=c) for p, c in zip(prompts(lens), chunks, strict=True)]
    running, num_steps_with_all_phases = [], 0
    while pending or not all(s.done for s in running):
        if pending:
            running.append(pending.pop(0))  # one arrival per step
        active = [s for s in running if not s.done]
        phases = {"decode" if s.cached_len >= len(s.prompt) else "chunk" if s.cached_len else "prefill" for s in active}
        num_steps_with_all_phases += phases == {"decode", "chunk", "prefill"}
        driver.step(active)
    assert num_steps_with_all_phases >= 3
    for seq in running:
        assert seq.output_ids == ref.greedy(seq.prompt), f"prompt of {len(seq.prompt)}"


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2", "qwen2_window"])
def test_decode_rows_in_chunks(checkpoints, name, monkeypatch):
    """The torch path's CPU decode attends in row chunks sized by bytes; force one row per chunk."""
    monkeypatch.setenv("ZSERVE_ATTENTION", "torch")
    monkeypatch.setattr(attention_metadata, "DECODE_CHUNK_BYTES", 1)
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir))
    outputs = driver.generate([driver.add(p, NEW_TOKENS) for p in prompts()])
    assert outputs == [ref.greedy(p) for p in prompts()]


@BOTH_PATHS
@pytest.mark.parametrize("name", list(VARIANTS))
def test_last_logits_close(checkpoints, name, attention):
    """After a prefill, a chunk, and a decode step, logits at the last position match transformers'."""
    model_dir, ref = checkpoints(name)
    runner = parity_runner(model_dir)
    driver = GreedyDriver(runner)
    prompt = random_prompt(23, seed=3)
    seq = driver.add(prompt, 3, chunk_size=15)
    for expect_len in (15, 23, 24):
        batch = driver.build_batch([seq])
        ours = runner.last_logits(batch)[0]
        seq.cached_len += int(batch.extend_lens[0])
        theirs = ref.ref.last_logits(seq.tokens[: seq.cached_len])
        assert seq.cached_len == expect_len
        torch.testing.assert_close(ours, theirs, atol=LOGITS_ATOL, rtol=0)
        if seq.cached_len == len(seq.tokens):
            seq.tokens.append(int(ours.argmax()))


WINDOW_KINDS = ["mistral_window", "qwen2_window"]


@BOTH_PATHS
@pytest.mark.parametrize("chunk_size", [5, 11])
@pytest.mark.parametrize("name", WINDOW_KINDS)
def test_sliding_window_chunks_straddle_the_window(checkpoints, name, chunk_size, attention):
    """Chunks shorter and longer than the window of 8 on both paths; prompts 3 to 6 windows long."""
    model_dir, ref = checkpoints(name)
    driver = GreedyDriver(parity_runner(model_dir))
    lens = (23, 48)
    ours = driver.generate([driver.add(p, NEW_TOKENS, chunk_size=chunk_size) for p in prompts(lens)])
    assert ours == [ref.greedy(p) for p in prompts(lens)]


@pytest.mark.parametrize("name", WINDOW_KINDS)
def test_the_window_is_applied(checkpoints, name, tmp_path):
    """The oracle does slide (the same weights without a window generate other tokens), so the
    parity tests above would fail if our layers attended over the whole context."""
    kind, _ = VARIANTS[name]
    model_dir, ref = checkpoints(name)
    no_window = make_tiny_checkpoint(tmp_path / "full", kind, sliding_window=None, use_sliding_window=False)
    full_ref = HfReference(no_window)
    for prompt in prompts((17, 40)):
        assert full_ref.generate(prompt, NEW_TOKENS) != ref.greedy(prompt)
    driver = GreedyDriver(parity_runner(no_window))
    assert driver.generate([driver.add(p, NEW_TOKENS) for p in prompts((17, 40))]) == [
        full_ref.generate(p, NEW_TOKENS) for p in prompts((17, 40))
    ]


def test_unsampled_chunk_returns_no_token(checkpoints):
    model_dir, _ = checkpoints("llama")
    driver = GreedyDriver(parity_runner(model_dir))
    seq = driver.add(random_prompt(10, seed=1), 1, chunk_size=4)
    batch = driver.build_batch([seq])
    batch.return_logprob = np.ones(1, bool)
    result = driver.runner.run(batch)
    assert result.next_token_ids.tolist() == [NO_TOKEN] and np.isnan(result.logprobs).all()
    assert np.isfinite(result.forward_ms)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2", "mistral"])
def test_identical_prompts_share_the_kv_of_the_first(checkpoints, name, page_size):
    """A KV source and two rows sharing its K/V after a prefix hit, in one batch with a decode and
    a fresh prefill: the sharers' slots hold exactly the source's K/V (a partial last page
    included), and each decodes on to transformers' greedy tokens."""
    model_dir, ref = checkpoints(name)
    runner = parity_runner(model_dir, page_size)
    driver = GreedyDriver(runner)
    a_prompt = random_prompt(40, seed=7)
    a = driver.add(a_prompt, NEW_TOKENS)
    driver.step([a])
    same = a_prompt[:20] + random_prompt(13, seed=8)
    source = driver.add(same, NEW_TOKENS, prefix_of=a, prefix_len=20)
    sharers = [driver.add(same, NEW_TOKENS, prefix_of=a, prefix_len=20, kv_source=source) for _ in range(2)]
    other = driver.add(random_prompt(9, seed=2), NEW_TOKENS)
    batch = driver.step([a, source, *sharers, other])
    cached = 20 // page_size * page_size
    assert batch.kv_source.tolist() == [0, 1, 1, 1, 4] and batch.cached_lens.tolist() == [40, cached, cached, cached, 0]
    assert batch.num_tokens == 1 + (33 - cached) + 9
    src_slots, dst_slots = (torch.from_numpy(s) for s in batch.shared_kv_slots(page_size))
    assert len(dst_slots) == 2 * (33 - cached) and not set(dst_slots.tolist()) & set(src_slots.tolist())
    for cache in (*runner.kv_pool.k, *runner.kv_pool.v):
        assert torch.equal(cache[:, dst_slots], cache[:, src_slots])
    assert source.tokens[33:] == sharers[0].tokens[33:] == sharers[1].tokens[33:]  # the same first token
    driver.generate([a, source, *sharers, other])
    assert a.output_ids == ref.greedy(a_prompt) and other.output_ids == ref.greedy(other.prompt)
    for seq in (source, *sharers):
        assert seq.output_ids == ref.greedy(same)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2"])
def test_kv_sharers_read_the_source_logits_and_sample_with_their_own_parameters(checkpoints, name):
    model_dir, ref = checkpoints(name)
    runner = parity_runner(model_dir)
    driver = GreedyDriver(runner)
    prompt = random_prompt(23, seed=3)
    source = driver.add(prompt, 1)
    batch = driver.build_batch([source, *(driver.add(prompt, 1, kv_source=source) for _ in range(3))])
    assert batch.kv_source.tolist() == [0, 0, 0, 0] and batch.num_tokens == 23
    logits = runner.last_logits(batch)
    assert all(torch.equal(logits[i], logits[0]) for i in (1, 2, 3))
    torch.testing.assert_close(logits[0], ref.ref.last_logits(prompt), atol=LOGITS_ATOL, rtol=0)
    each = driver.build_batch([driver.add(prompt, 1) for _ in range(4)])  # the same four, each computed
    assert each.kv_source is None and each.num_tokens == 4 * 23
    torch.testing.assert_close(runner.last_logits(each), logits, atol=LOGITS_ATOL, rtol=0)

    sampling = SamplingArrays(
        temperature=np.array([0.0, 0.8, 1.3, 0.8], np.float32), top_k=np.array([0, 0, 20, 0], np.int32),
        top_p=np.array([1.0, 0.9, 1.0, 1.0], np.float32), min_p=np.array([0.0, 0.0, 0.0, 0.05], np.float32),
        seed=np.array([1, 11, 12, 13], np.int64),
    )
    batch.sampling, batch.return_logprob = sampling, np.ones(4, bool)
    result = runner.run(batch)
    for i in range(4):  # each row draws what it would draw computed alone, with its own parameters and seed
        alone = driver.build_batch([driver.add(prompt, 1)])
        alone.sampling, alone.return_logprob = sampling.select(np.arange(4) == i), np.ones(1, bool)
        expected = runner.run(alone)
        assert result.next_token_ids[i] == expected.next_token_ids[0], i
        np.testing.assert_allclose(result.logprobs[i], expected.logprobs[0], rtol=0, atol=1e-6)
    assert result.next_token_ids[0] == int(logits[0].argmax())


@BOTH_PATHS
@pytest.mark.parametrize("name", ["phi3", "phi4_partial"])
def test_longrope_against_unmodified_transformers(checkpoints, name, attention):
    """The parity oracle keeps Phi-3's cache across the longrope switch (HfReference); here is
    transformers' own generate, which drops it: equal for requests that stay on one side of
    original_max_position_embeddings (48), a prompt past it included, and different only after a
    request crosses it during decode (zserve keeps the short-rotated keys; rope_frequencies.py)."""
    model_dir, _ = checkpoints(name)
    ref = HfReference(model_dir, keep_cache=False)
    driver = GreedyDriver(parity_runner(model_dir))
    short, long = random_prompt(20, seed=20), random_prompt(60, seed=60)  # 20 + 28 = 48: never past it
    ours = driver.generate([driver.add(short, 28), driver.add(long, NEW_TOKENS)])
    assert ours == [ref.generate(short, 28), ref.generate(long, NEW_TOKENS)]
    crossing = random_prompt(40, seed=40)
    assert driver.generate([driver.add(crossing, NEW_TOKENS)])[0] != ref.generate(crossing, NEW_TOKENS)
