"""ModelRunner plumbing: sampling and logprobs through run(), KV pool sizing, worker threads/env."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from testing.model_fixtures import GreedyDriver, HfReference, make_runner, random_prompt
from zserve.common.forward_batch import NO_TOKEN, GrammarMasks, PenaltyArrays, SamplingArrays
from zserve.common.worker_env import OMP_SPIN_COUNT, default_num_threads, worker_env
from zserve.model_proc.compute_dtype import resolve_dtype
from zserve.model_proc.layers.kv_pool import KVPool, free_memory_bytes


def test_info_for_the_scheduler(llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="zserve.model_proc.model_runner"):
        runner = make_runner(llama_dir, device="cpu", page_size=8, kv_cache_tokens=100)
    assert runner.info() == {"num_pages": 13, "page_size": 8, "context_len": 256, "eos_token_ids": [2, 0], "vocab_size": 600,
                             "device_type": "cpu"}
    dtype, reason = resolve_dtype("auto", torch.device("cpu"))  # the default, with the reason logged at startup
    assert runner.dtype == dtype and runner.device.type == "cpu"
    assert f"({dtype}, {reason})" in caplog.text


def test_logprobs_and_sampling_through_run(llama_dir):
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=256)
    driver = GreedyDriver(runner)
    prompt = random_prompt(12, seed=5)
    seqs = [driver.add(prompt, 1), driver.add(prompt, 1), driver.add(random_prompt(4, seed=6), 1)]
    batch = driver.build_batch(seqs)
    batch.return_logprob = np.array([True, False, True])
    batch.sampling = SamplingArrays.greedy(3)
    batch.sampling.temperature[1] = 1.0  # row 1 samples, rows 0 and 2 are greedy
    batch.sampling.seed[1] = 1234
    result = runner.run(batch)
    assert result.next_token_ids.dtype == np.int32 and result.next_token_ids.shape == (3,)
    assert np.isnan(result.logprobs[1]) and not np.isnan(result.logprobs[[0, 2]]).any()
    ref = HfReference(llama_dir)
    expected = torch.log_softmax(ref.last_logits(prompt), -1)
    assert result.next_token_ids[0] == int(expected.argmax())
    assert abs(result.logprobs[0] - float(expected.max())) < 1e-4
    assert result.forward_ms > 0


def test_every_array_is_by_batch_row_with_an_unsampled_chunk_first(llama_dir):
    """An unsampled chunk in row 0: the logit bias names row 1, the grammar mask and top
    logprobs row 2, and StepResult has one entry per row (NO_TOKEN and NaN for the chunk)."""
    i32 = lambda xs: np.array(xs, np.int32)  # noqa: E731
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=256)
    driver = GreedyDriver(runner)
    seqs = [driver.add(random_prompt(12, seed=1), 1, chunk_size=5), driver.add(random_prompt(6, seed=2), 1),
            driver.add(random_prompt(7, seed=3), 1)]
    batch = driver.build_batch(seqs)
    assert batch.is_sampled.tolist() == [False, True, True]
    raw = runner.last_logits(batch)
    batch.return_logprob = np.ones(3, bool)
    batch.top_logprobs = i32([0, 0, 3])
    batch.penalties = PenaltyArrays(
        rows=i32([1]), repetition=np.ones(1, np.float32), frequency=np.zeros(1, np.float32), presence=np.zeros(1, np.float32),
        token_offsets=i32([0, 0]), token_ids=i32([]), output_counts=i32([]),
        bias_offsets=i32([0, 1]), bias_ids=i32([17]), bias_values=np.array([1e4], np.float32),
        banned_offsets=i32([0, 0]), banned_ids=i32([]),
    )
    words = np.zeros(-(-600 // 32), np.int32)
    words[0] = 1 << 23  # token 23 only
    batch.grammar = GrammarMasks(rows=i32([2]), words_per_row=words.size, bitmask=words)
    result = runner.run(batch)
    assert result.next_token_ids.tolist() == [NO_TOKEN, 17, 23]
    assert np.isnan(result.logprobs[0]) and not np.isnan(result.logprobs[1:]).any()
    expected = torch.log_softmax(raw, -1)  # logprobs and top logprobs are the raw logits'
    np.testing.assert_allclose(result.logprobs[1:], [float(expected[1, 17]), float(expected[2, 23])], atol=1e-5)
    assert result.num_top == 3 and result.top_ids.shape == (3 * 3,)
    assert result.top_ids.reshape(3, 3)[2].tolist() == torch.topk(expected[2], 3).indices.tolist()


def test_kv_pool_sized_from_memory(llama_dir):
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=16, kv_cache_tokens=0, kv_memory_fraction=0.001)
    per_token = KVPool.bytes_per_token(2, 2, 16, torch.float32)
    expected = free_memory_bytes(torch.device("cpu")) * 0.001 / (per_token * 16)
    assert 0.5 * expected < runner.num_pages_total < 2 * expected
    with pytest.raises(ValueError, match="fraction must be in"):
        make_runner(llama_dir, device="cpu", kv_cache_tokens=0, kv_memory_fraction=1.5)


def test_mem_fraction_static_is_a_share_of_all_memory_for_weights_and_kv(llama_dir, monkeypatch, caplog):
    """SGLang's --mem-fraction-static (vLLM's --gpu-memory-utilization): fraction x total memory holds the weights
    and the KV pool; the pool gets what the weights leave, capped at 90% of the memory free now."""
    import zserve.model_proc.layers.kv_pool as kv_pool

    gib = 2**30
    monkeypatch.setattr(kv_pool, "total_memory_bytes", lambda device: 10 * gib)
    monkeypatch.setattr(kv_pool, "free_memory_bytes", lambda device: 8 * gib)
    per_page = 4096 * 16
    assert KVPool.num_pages_for_static_share(0.5, torch.device("cpu"), 1 * gib, 4096, 16) == 4 * gib // per_page
    with caplog.at_level("WARNING"):  # 9 GiB - 1 GiB of weights > 90% of the 8 GiB free
        assert KVPool.num_pages_for_static_share(0.9, torch.device("cpu"), 1 * gib, 4096, 16) == int(8 * gib * 0.9) // per_page
    assert "only 7.20 GiB are free" in caplog.text
    with pytest.raises(ValueError, match="does not hold the 2.00 GiB of weights"):
        KVPool.num_pages_for_static_share(0.1, torch.device("cpu"), 2 * gib, 4096, 16)
    monkeypatch.setattr(kv_pool, "total_memory_bytes", lambda device: 64 * 2**20)  # the pool is mapped lazily, but keep it small
    monkeypatch.setattr(kv_pool, "free_memory_bytes", lambda device: 64 * 2**20)
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=16, kv_cache_tokens=0, mem_fraction_static=0.5)
    weights = sum(t.numel() * t.element_size() for t in (*runner.model.parameters(), *runner.model.buffers()))
    assert runner.num_pages_total == (32 * 2**20 - weights) // (KVPool.bytes_per_token(2, 2, 16, torch.float32) * 16)


def test_kv_pool_layout():
    pool = KVPool(num_layers=2, num_kv_heads=3, head_dim=8, page_size=4, num_pages=5, dtype=torch.float32, device=torch.device("cpu"))
    assert pool.num_slots == 20 and pool.k[0].shape == (3, 20, 8)
    assert pool.num_bytes == 2 * 2 * 20 * 3 * 8 * 4
    pool.k[1][:, 4 * 2 + 1] = 7.0  # slot of page 2, offset 1
    assert (pool.pages(pool.k[1])[:, 2, 1] == 7.0).all()
    assert KVPool.num_pages_for(17, 4) == 5


def test_worker_env():
    assert default_num_threads(2) == 2 and default_num_threads(1) == 1 and default_num_threads(16) == 16
    env = worker_env(3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3" and env["GOMP_SPINCOUNT"] == str(OMP_SPIN_COUNT)
    assert "OMP_WAIT_POLICY" not in env  # PASSIVE would force a spin count of 0
    assert worker_env(1, "cpu", 0)["GOMP_SPINCOUNT"] == "0"
    assert int(worker_env(0, "cuda")["OMP_NUM_THREADS"]) <= 2
    with pytest.raises(ValueError, match="num_threads"):
        worker_env(-1)
    with pytest.raises(ValueError, match="omp_spin_count"):
        worker_env(1, "cpu", -1)
