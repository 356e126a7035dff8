"""Pooling through the ModelRunner (--task embed): each row's chunk vectors, folded as the scheduler
folds them (common/pooling.py), equal transformers' AutoModel pooled per the sentence-transformers
config, to 1e-5 in fp32, with chunked prefill and a batch of several lengths."""

from __future__ import annotations

import numpy as np
import pytest

from testing.embedding_fixtures import hf_embeddings, make_embedding_checkpoint
from testing.model_fixtures import GreedyDriver, make_runner, random_prompt
from zserve.common.pooling import Pooling

LENGTHS = (1, 5, 13, 30)


@pytest.fixture(scope="module", params=["last", "mean", "cls"])
def embedding_dir(request, tmp_path_factory):
    return make_embedding_checkpoint(tmp_path_factory.mktemp(f"emb_{request.param}"), request.param)


def run_pooled(model_dir, prompts: list[list[int]], chunk_size: int | None) -> np.ndarray:
    """Prefill `prompts` together (chunks of `chunk_size`), folding each row's vectors per step."""
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512)
    pooling = Pooling.from_model_dir(model_dir)
    driver = GreedyDriver(runner)
    seqs = [driver.add(p, 1, chunk_size=chunk_size) for p in prompts]
    folded: list[np.ndarray | None] = [None] * len(seqs)
    while any(seq.cached_len < len(seq.prompt) for seq in seqs):
        rows = [i for i, seq in enumerate(seqs) if seq.cached_len < len(seq.prompt)]
        batch = driver.build_batch([seqs[i] for i in rows])
        batch.pooling = pooling.mode
        result = runner.run(batch)
        vectors = result.pooled.reshape(len(rows), -1)
        for j, i in enumerate(rows):
            seqs[i].cached_len += int(batch.extend_lens[j])
            folded[i] = pooling.combine(folded[i], vectors[j])
    return np.stack([pooling.finish(v, len(p)) for v, p in zip(folded, prompts, strict=True)])


@pytest.mark.parametrize("chunk_size", [None, 6])
def test_pooled_equals_transformers(embedding_dir, chunk_size):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    ours = run_pooled(embedding_dir, prompts, chunk_size)
    expected = hf_embeddings(embedding_dir, prompts)
    assert np.abs(ours - expected).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # the prompts differ, and so do their vectors: a pooling that mixed rows up would fail above
    assert np.abs(ours[0] - ours[1]).max() > 1e-2


def test_kv_sharing_row_gets_its_sources_vector(tmp_path):
    model_dir = make_embedding_checkpoint(tmp_path / "emb", "mean")
    runner = make_runner(model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=256)
    driver = GreedyDriver(runner)
    prompt = random_prompt(9, seed=3)
    first = driver.add(prompt, 1)
    seqs = [first, driver.add(prompt, 1, kv_source=first), driver.add(random_prompt(4, seed=4), 1)]
    batch = driver.build_batch(seqs)
    batch.pooling = "mean"
    vectors = runner.run(batch).pooled.reshape(3, -1)
    assert np.array_equal(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
    pooling = Pooling.from_model_dir(model_dir)
    assert np.abs(pooling.finish(vectors[1], 9) - hf_embeddings(model_dir, [prompt])[0]).max() < 1e-5


def test_a_bare_model_checkpoint_is_read_under_the_causal_lm_names(tmp_path):
    """Saved as sentence-transformers saves a bare Qwen3Model (`layers.0...`, no `model.` prefix, no lm_head):
    the same vectors as transformers' AutoModel on that directory."""
    model_dir = make_embedding_checkpoint(tmp_path / "bare", "last", bare=True)
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        assert "embed_tokens.weight" in f.keys() and not any(k.startswith(("model.", "lm_head")) for k in f.keys())
    prompts = [random_prompt(n, seed=n) for n in (3, 11)]
    ours = run_pooled(model_dir, prompts, chunk_size=4)
    assert np.abs(ours - hf_embeddings(model_dir, prompts)).max() < 1e-5
