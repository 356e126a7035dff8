"""Sampler: per-row parameters, reproducibility, allowed sets and frequencies.

Every random draw here comes from fixed seeds, so a test that passes once passes always. The
allowed sets are computed in float64 numpy, independently of the sampler's code, and the
top_p / min_p values sit halfway between two possible cut-offs, so rounding cannot move them.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from zserve.common.forward_batch import SamplingArrays
from zserve.model_proc.sampler import HEAD_LEN, Sampler, uniform_from_seed

VOCAB = 300


@pytest.fixture(scope="module")
def sampler() -> Sampler:
    return Sampler("cpu")


def make_logits(num_rows: int, vocab: int = VOCAB, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0.0, scale, (num_rows, vocab)).astype(np.float32))


def params(n: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None) -> SamplingArrays:
    return SamplingArrays(
        temperature=np.broadcast_to(np.asarray(temperature, np.float32), (n,)).copy(),
        top_k=np.broadcast_to(np.asarray(top_k, np.int32), (n,)).copy(),
        top_p=np.broadcast_to(np.asarray(top_p, np.float32), (n,)).copy(),
        min_p=np.broadcast_to(np.asarray(min_p, np.float32), (n,)).copy(),
        seed=np.arange(n, dtype=np.int64) if seed is None else np.broadcast_to(np.asarray(seed, np.int64), (n,)).copy(),
    )


def positions(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


def no_logprob(n: int) -> np.ndarray:
    return np.zeros(n, bool)


def draw_many(sampler: Sampler, row: torch.Tensor, num_draws: int, **kw) -> np.ndarray:
    """`num_draws` tokens from one row of logits: one batch, a different seed per row."""
    logits = row[None, :].expand(num_draws, -1).contiguous()
    ids, _ = sampler.sample(logits, params(num_draws, **kw), positions(num_draws, 7), no_logprob(num_draws))
    return ids.numpy()


def relative_probs(row: torch.Tensor, temperature: float) -> np.ndarray:
    scaled = row.numpy().astype(np.float64) / temperature
    return np.exp(scaled - scaled.max())


# --- reproducibility --------------------------------------------------------------------------


def test_same_seed_same_tokens_different_seeds_differ(sampler):
    logits = make_logits(1).expand(64, -1).contiguous()  # one distribution, 64 positions
    pos = positions(64, 100)

    def run(seed: int) -> np.ndarray:
        ids, _ = sampler.sample(logits, params(64, temperature=1.0, seed=seed), pos, no_logprob(64))
        return ids.numpy()

    assert np.array_equal(run(1234), run(1234))
    assert not np.array_equal(run(1234), run(1235))
    assert len(set(run(1234).tolist())) > 10  # the position moves the draw too


def test_row_same_token_alone_and_in_a_mixed_batch(sampler):
    n = 12
    logits = make_logits(n, seed=1)
    batch = SamplingArrays(
        temperature=np.array([0, 1.0, 0.7, 1.3, 0.0, 1.0, 0.9, 2.0, 1.0, 0.5, 1.0, 1.1], np.float32),
        top_k=np.array([0, 0, 5, 0, 3, 0, 40, 250, 0, 1, 200, 0], np.int32),  # 250 > HEAD_LEN: longer heads
        top_p=np.array([1, 1, 1, 0.8, 1, 0.5, 0.9, 1, 1, 1, 0.95, 0.99], np.float32),
        min_p=np.array([0, 0, 0, 0, 0, 0.1, 0, 0.05, 0.02, 0, 0, 0.001], np.float32),
        seed=np.arange(n, dtype=np.int64) * 1_000_003 + 17,
    )
    assert batch.top_k.max() > HEAD_LEN
    pos = positions(n, 40)
    together, _ = sampler.sample(logits, batch, pos, no_logprob(n))
    for i in range(n):
        one = batch.select(np.arange(n) == i)
        alone, _ = sampler.sample(logits[i : i + 1], one, pos[i : i + 1], no_logprob(1))
        assert int(alone[0]) == int(together[i]), f"row {i} changed with its batch"
    # Reversed order, duplicated rows: still each row's own token.
    order = np.r_[np.arange(n)[::-1], np.arange(n)]
    shuffled = SamplingArrays(*(getattr(batch, f)[order] for f in ("temperature", "top_k", "top_p", "min_p", "seed")))
    again, _ = sampler.sample(logits[order], shuffled, pos[order], no_logprob(2 * n))
    assert np.array_equal(again.numpy(), together.numpy()[order])


def test_uniforms_are_uniform_and_reproducible():
    seeds = np.repeat(np.arange(100, dtype=np.int64), 100)
    pos = np.tile(np.arange(100, dtype=np.int64), 100)
    u = uniform_from_seed(seeds, pos)
    assert np.array_equal(u, uniform_from_seed(seeds, pos))
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = np.bincount((u * 10).astype(int), minlength=10)
    assert np.all(np.abs(counts - 1000) < 150)
    assert len(np.unique(u)) == u.size


# --- greedy --------------------------------------------------------------------------------------


def test_all_greedy_is_one_argmax_without_sorting(sampler):
    logits = make_logits(32, vocab=1000)
    with (
        mock.patch("torch.sort", side_effect=AssertionError("sorted")),
        mock.patch("torch.topk", side_effect=AssertionError("topk")),
        mock.patch("torch.cumsum", side_effect=AssertionError("cumsum")),
    ):
        ids, logprobs = sampler.sample(logits, SamplingArrays.greedy(32), positions(32), no_logprob(32))
    assert ids.dtype == torch.int32 and logprobs.dtype == torch.float32
    assert np.array_equal(ids.numpy(), logits.argmax(dim=-1).numpy())
    assert torch.isnan(logprobs).all()


def test_greedy_rows_in_a_sampled_batch_take_the_argmax(sampler):
    logits = make_logits(16, seed=3)
    temperature = np.where(np.arange(16) % 2 == 0, 0.0, 1.5).astype(np.float32)
    ids, _ = sampler.sample(logits, params(16, temperature=temperature), positions(16), no_logprob(16))
    greedy = np.arange(16) % 2 == 0
    assert np.array_equal(ids.numpy()[greedy], logits.argmax(dim=-1).numpy()[greedy])


def test_a_tiny_temperature_is_greedy(sampler):
    logits = make_logits(8, seed=12)
    temperature = np.array([1e-30, 1e-38, 1e-45, 1e-6, 0.0, 1.0, 1e-30, 0.0], np.float32)
    ids, _ = sampler.sample(logits, params(8, temperature=temperature), positions(8), no_logprob(8))
    greedy = temperature != 1.0
    assert np.array_equal(ids.numpy()[greedy], logits.argmax(dim=-1).numpy()[greedy])


def test_top_k_one_equals_greedy(sampler):
    logits = make_logits(64, seed=4)
    ids, _ = sampler.sample(logits, params(64, temperature=1.7, top_k=1), positions(64), no_logprob(64))
    assert np.array_equal(ids.numpy(), logits.argmax(dim=-1).numpy())


# --- allowed sets ----------------------------------------------------------------------------------


def test_top_k_never_leaves_the_k_largest(sampler):
    row = make_logits(1, seed=5)[0]
    for k in (2, 10, 100):
        allowed = set(np.argsort(-row.numpy())[:k].tolist())
        drawn = draw_many(sampler, row, 1000, temperature=2.0, top_k=k)
        assert set(drawn.tolist()) <= allowed
        assert len(set(drawn.tolist())) > min(k, 20) // 2  # and it does sample among them


@pytest.mark.parametrize("temperature", [0.6, 1.0, 2.5])
def test_top_p_never_leaves_the_nucleus(sampler, temperature):
    row = make_logits(1, seed=6)[0]
    probs = relative_probs(row, temperature)
    probs /= probs.sum()
    order = np.argsort(-probs)
    cumulative = np.cumsum(probs[order])
    for size in (1, 3, 12, 60):
        # top_p halfway between the mass of the top `size - 1` and the top `size` tokens: the
        # nucleus is exactly the top `size` tokens, away from any rounding.
        below = cumulative[size - 2] if size > 1 else 0.0
        top_p = (below + cumulative[size - 1]) / 2
        allowed = set(order[:size].tolist())
        drawn = draw_many(sampler, row, 1000, temperature=temperature, top_p=top_p)
        assert set(drawn.tolist()) <= allowed, f"top_p={top_p:.4f} (nucleus of {size})"


@pytest.mark.parametrize("temperature", [0.6, 1.0, 2.5])
def test_min_p_never_goes_below_min_p_times_the_largest(sampler, temperature):
    row = make_logits(1, seed=7)[0]
    relative = relative_probs(row, temperature)
    ranked = np.sort(relative)[::-1]
    for size in (1, 4, 30):
        min_p = (ranked[size - 1] + ranked[size]) / 2  # keeps exactly the top `size` tokens
        allowed = set(np.flatnonzero(relative >= min_p).tolist())
        assert len(allowed) == size
        drawn = draw_many(sampler, row, 1000, temperature=temperature, min_p=min_p)
        assert set(drawn.tolist()) <= allowed, f"min_p={min_p:.4f}"


def test_top_k_then_top_p_then_min_p(sampler):
    """top-p is measured on what top-k kept (renormalised); min-p then cuts further."""
    row = make_logits(1, seed=8, scale=0.3)[0]  # flat: top-p alone would keep most of the vocab
    probs = relative_probs(row, 1.0)
    order = np.argsort(-probs)
    top_k = 20
    head = probs[order[:top_k]] / probs[order[:top_k]].sum()
    cumulative = np.cumsum(head)
    top_p = (cumulative[9] + cumulative[10]) / 2  # keeps 11 of the 20
    drawn = draw_many(sampler, row, 3000, temperature=1.0, top_k=top_k, top_p=top_p)
    assert set(drawn.tolist()) <= set(order[:11].tolist())
    assert len(set(drawn.tolist())) == 11
    min_p = (probs[order[4]] + probs[order[5]]) / 2 / probs[order[0]]  # keeps 5 of those 11
    drawn = draw_many(sampler, row, 3000, temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    assert set(drawn.tolist()) == set(order[:5].tolist())


def test_a_nucleus_longer_than_the_first_head(sampler):
    """A flat distribution's nucleus is thousands of tokens: still exact."""
    row = make_logits(1, vocab=3000, seed=9, scale=0.1)[0]
    probs = relative_probs(row, 1.0)
    probs /= probs.sum()
    order = np.argsort(-probs)
    cumulative = np.cumsum(probs[order])
    size = 1800  # past the first head (64) and the second (1024)
    top_p = (cumulative[size - 2] + cumulative[size - 1]) / 2
    drawn = draw_many(sampler, row, 400, temperature=1.0, top_p=top_p)
    assert set(drawn.tolist()) <= set(order[:size].tolist())
    assert len(set(drawn.tolist())) > 300


# --- frequencies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_frequencies_follow_softmax(sampler, temperature):
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5])
    expected = torch.softmax(row.double() / temperature, dim=-1).numpy()
    num_draws = 20_000
    counts = np.bincount(draw_many(sampler, row, num_draws, temperature=temperature), minlength=row.numel())
    chi_square = float((((counts - num_draws * expected) ** 2) / (num_draws * expected)).sum())
    # 7 degrees of freedom: P(chi2 > 35) ~ 1e-5. Seeds are fixed, so this never flakes.
    assert chi_square < 35, (chi_square, counts, num_draws * expected)


def test_filtered_frequencies_follow_the_renormalised_distribution(sampler):
    row = torch.tensor([2.0, 1.8, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    num_draws = 20_000
    counts = np.bincount(draw_many(sampler, row, num_draws, temperature=1.0, top_k=4), minlength=8)
    expected = torch.softmax(row[:4].double(), dim=-1).numpy()
    assert counts[4:].sum() == 0
    chi_square = float((((counts[:4] - num_draws * expected) ** 2) / (num_draws * expected)).sum())
    assert chi_square < 30, (chi_square, counts)


# --- logprobs ---------------------------------------------------------------------------------------


def test_logprob_is_log_softmax_of_raw_logits_at_the_chosen_token(sampler):
    n = 10
    logits = make_logits(n, seed=10)
    batch = params(n, temperature=np.r_[np.zeros(3), np.full(7, 0.7)], top_k=np.r_[np.zeros(5), np.full(5, 10)])
    want = np.array([1, 0, 1, 1, 0, 1, 1, 0, 1, 1], bool)
    ids, logprobs = sampler.sample(logits, batch, positions(n), want)
    expected = torch.log_softmax(logits.double(), dim=-1).gather(1, ids.long()[:, None]).squeeze(1).float()
    assert torch.allclose(logprobs[want], expected[want], atol=1e-5)
    assert torch.isnan(logprobs[~want]).all()


def test_logits_are_not_modified(sampler):
    logits = make_logits(8, seed=11)
    before = logits.clone()
    sampler.sample(logits, params(8, temperature=0.8, top_k=5, top_p=0.9, min_p=0.05), positions(8), np.ones(8, bool))
    assert torch.equal(logits, before)


def test_mismatched_lengths_raise(sampler):
    with pytest.raises(ValueError, match="rows of logits"):
        sampler.sample(make_logits(4), params(3), positions(4), no_logprob(4))
    with pytest.raises(ValueError, match="positions"):
        sampler.sample(make_logits(4), params(4), positions(5), no_logprob(4))
