"""Speculative decoding, the worker's side: rows with draft tokens (ForwardBatch's Drafts).

Greedy, through ModelRunner on a tiny random llama: drafts from transformers' greedy text are
all accepted, a wrong draft at j gives num_accepted == j and transformers' token, and decoding
on from the scheduler's view (cached_len + 1 + num_accepted) stays transformers' greedy text.
Sampled, on synthetic logits: the emitted tokens are the ones non-speculative sampling draws with
the same seeds, and over 4000 seeds their frequencies match the processed distribution p
(computed here in float64 numpy, independently of the sampler) by a chi-square bound that
broken rules (always accept, no renormalisation) fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.draft_driver import DraftDriver
from testing.model_fixtures import (
    GreedyDriver,
    HfReference,
    Seq,
    first_divergence,
    make_runner,
    random_prompt,
)
from testing.paged_batches import drafted_decode_batch
from zserve.common.forward_batch import (
    ForwardBatch,
    GrammarMasks,
    PenaltyArrays,
    PromptLogprobRows,
    SamplingArrays,
)
from zserve.model_proc.draft_verifier import DraftVerifier
from zserve.model_proc.sampler import Sampler, uniform_from_seed

NEAR_TIE_ULPS = 4  # bf16: as test_model_parity_bf16.py
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def references(llama_dir):
    return {torch.float32: HfReference(llama_dir), torch.bfloat16: HfReference(llama_dir, dtype=torch.bfloat16)}


def check_against_transformers(ref: HfReference, seq: Seq, dtype: torch.dtype) -> None:
    theirs, logits = ref.generate_with_logits(seq.prompt, len(seq.output_ids))
    if dtype == torch.float32:
        assert seq.output_ids == theirs
    else:  # bf16 may leave transformers' text only at a near-tie of its logits
        first_divergence(seq.output_ids, theirs, logits, NEAR_TIE_ULPS)


def prefilled(llama_dir, dtype: torch.dtype, prompt: list[int]) -> tuple[DraftDriver, Seq]:
    """A greedy request on a fresh runner in `dtype`, after its prefill step (one token out)."""
    runner = make_runner(llama_dir, device="cpu", dtype=str(dtype).removeprefix("torch."), page_size=4, kv_cache_tokens=2048)
    driver = DraftDriver(runner)
    seq = driver.add(prompt, NEW_TOKENS)
    driver.step([seq])
    return driver, seq


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_drafts_of_the_true_text_are_all_accepted(llama_dir, references, dtype):
    ref = references[dtype]
    prompt = random_prompt(9, seed=21)
    truth, truth_logits = ref.generate_with_logits(prompt, NEW_TOKENS + 10)
    driver, seq = prefilled(llama_dir, dtype, prompt)
    diverged = first_divergence(seq.output_ids, truth[:1], truth_logits[:1], NEAR_TIE_ULPS)
    for d in (4, 1, 5, 3, 8, 2, 4):
        done = len(seq.output_ids)
        _, result = driver.step_drafted([seq], [truth[done : done + d]])
        if dtype == torch.float32:
            assert result.num_accepted.tolist() == [d]
        elif diverged is None and result.num_accepted[0] < d:  # bf16: a draft is refused only where our token leaves transformers' at a near-tie
            n = len(seq.output_ids)
            assert first_divergence(seq.output_ids, truth[:n], truth_logits[:n], NEAR_TIE_ULPS) == done + result.num_accepted[0]
        assert len(seq.output_ids) == done + result.num_accepted[0] + 1
        diverged = first_divergence(seq.output_ids, truth[: len(seq.output_ids)], truth_logits[: len(seq.output_ids)], NEAR_TIE_ULPS)
        if dtype == torch.float32:
            assert diverged is None
    if diverged is None:
        assert len(seq.output_ids) == 1 + 27 + 7  # every draft accepted, plus each step's own token
    check_against_transformers(ref, seq, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_wrong_draft_at_j_accepts_j_and_decoding_goes_on_to_the_true_text(llama_dir, references, dtype):
    ref = references[dtype]
    prompt = random_prompt(13, seed=22)
    truth = ref.generate(prompt, NEW_TOKENS + 10)
    driver, seq = prefilled(llama_dir, dtype, prompt)
    for d, j in ((4, 0), (4, 2), (3, 3), (5, 4), (1, 0), (6, 1), (2, 1)):  # j == d: every draft right
        done = len(seq.output_ids)
        draft = truth[done : done + d]
        if j < d:
            draft[j] = (draft[j] + 1) % 600  # not the model's token
        _, result = driver.step_drafted([seq], [draft])
        if seq.output_ids == truth[: len(seq.output_ids)]:
            assert result.num_accepted.tolist() == [j]
        elif dtype == torch.float32:
            raise AssertionError(f"left transformers' text: {seq.output_ids} vs {truth}")
    driver.generate([seq])  # plain decoding (no draft_lens) on from where the drafts left it
    check_against_transformers(ref, seq, dtype)


def test_drafted_rows_of_every_length_next_to_prefill_chunks_and_kv_sharing(llama_dir, references):
    """One batch: rows with d = 1, 3, 0, 5 drafts (some wrong), a decode row, a fresh prompt, the
    chunk of a longer one (unsampled), and an identical prompt sharing its source's K/V; then
    several such steps. Every row ends on transformers' greedy text."""
    ref = references[torch.float32]
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=4096)
    driver = DraftDriver(runner)
    prompts = [random_prompt(n, seed=30 + n) for n in (5, 11, 7, 16, 3)]
    truths = [ref.generate(p, NEW_TOKENS + 8) for p in prompts]
    decoding = [driver.add(p, NEW_TOKENS) for p in prompts]
    driver.step(decoding)
    fresh_prompt, long_prompt = random_prompt(10, seed=41), random_prompt(19, seed=42)
    fresh = driver.add(fresh_prompt, NEW_TOKENS)
    sharer = driver.add(fresh_prompt, NEW_TOKENS, kv_source=fresh)
    chunked = driver.add(long_prompt, NEW_TOKENS, chunk_size=8)
    rng = np.random.default_rng(0)
    seqs = [*decoding, fresh, sharer, chunked]
    for step in range(4):
        drafts = []
        for seq, truth, d in zip(decoding, truths, (1, 3, 0, 5, 0), strict=True):
            done = len(seq.output_ids)
            draft = truth[done : done + d]
            if d and rng.random() < 0.5:
                draft[int(rng.integers(d))] = int(rng.integers(3, 600))  # maybe wrong
            drafts.append(draft)
        batch, result = driver.step_drafted(seqs, drafts + [[]] * (len(seqs) - len(decoding)))
        if step == 0:
            assert batch.kv_source is not None and batch.kv_source.tolist() == [0, 1, 2, 3, 4, 5, 5, 7]
            assert batch.draft_lens.tolist() == [1, 3, 0, 5, 0, 0, 0, 0] and not batch.is_sampled[7]
        assert result.num_accepted[len(decoding) :].tolist() == [0] * (len(seqs) - len(decoding))
        for seq, truth in zip(decoding, truths, strict=True):
            assert seq.output_ids == truth[: len(seq.output_ids)]
    assert chunked.cached_len == 20 and fresh.output_ids == sharer.output_ids
    driver.generate(seqs)
    for seq in seqs:
        assert seq.output_ids == ref.generate(seq.prompt, NEW_TOKENS)


def test_seeded_sampled_rows_with_drafts_emit_the_text_of_non_speculative_sampling(llama_dir):
    """Sampled rows (and a greedy one) decoded with drafts, some wrong, emit token for token what
    the same seeds emit without drafts: the draw at each position is the one plain decoding makes."""
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=4096)
    prompts = [random_prompt(n, seed=50 + n) for n in (6, 9, 4)]
    params = [(0.9, 0, 0.95, 0.0, 5), (0.7, 20, 1.0, 0.05, 6), (0.0, 0, 1.0, 0.0, 7)]

    def start() -> tuple[DraftDriver, list[Seq]]:
        seqs = [Seq(p, NEW_TOKENS + 6) for p in prompts]
        return DraftDriver(runner, {id(seq): ps for seq, ps in zip(seqs, params, strict=True)}), seqs

    driver, plain = start()
    driver.generate(plain)
    driver, seqs = start()
    driver.step(seqs)
    rng = np.random.default_rng(1)
    num_accepted = 0
    while max(len(seq.output_ids) for seq in seqs) < NEW_TOKENS:  # each step adds at most 6
        drafts = []
        for seq, ref in zip(seqs, plain, strict=True):
            done = len(seq.output_ids)
            draft = ref.output_ids[done : done + int(rng.integers(0, 6))]
            if draft and rng.random() < 0.3:
                draft[-1] = (draft[-1] + 1) % 600
            drafts.append(draft)
        _, result = driver.step_drafted(seqs, drafts)
        num_accepted += int(result.num_accepted.sum())
        for seq, ref in zip(seqs, plain, strict=True):
            assert seq.output_ids == ref.output_ids[: len(seq.output_ids)]
    assert num_accepted > 20
    driver.generate(seqs)  # and plain decoding on, to the end
    assert [seq.output_ids for seq in seqs] == [seq.output_ids for seq in plain]
    assert len({tuple(seq.output_ids) for seq in plain}) == 3


def test_no_drafts_or_all_zero_drafts_give_the_same_tokens_as_before(llama_dir):
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=4, kv_cache_tokens=512)
    prompt = random_prompt(12, seed=3)
    results = []
    for draft_lens in (None, np.zeros(2, np.int32)):
        driver = GreedyDriver(runner)
        batch = driver.build_batch([driver.add(prompt, 1), driver.add(random_prompt(5, seed=4), 1)])
        batch.sampling.temperature[1], batch.sampling.seed[1] = 0.9, 77
        batch.draft_lens = draft_lens
        results.append(runner.run(batch))
    assert results[0].num_accepted is None and results[1].num_accepted.tolist() == [0, 0]
    assert np.array_equal(results[0].next_token_ids, results[1].next_token_ids)


# --- validate(): a drafted row is a plain decoding row ----------------------------------------


def drafted(**changes) -> ForwardBatch:
    batch = drafted_decode_batch(np.random.default_rng(0), [6, 9], [5, 8], [[1, 2], [3]], page_size=4, num_pages_total=16)
    for name, value in changes.items():
        setattr(batch, name, value)
    return batch


def i32(xs) -> np.ndarray:
    return np.asarray(xs, np.int32)


@pytest.mark.parametrize(
    "changes",
    [
        dict(return_logprob=np.array([False, True])),
        dict(top_logprobs=i32([2, 0])),
        dict(grammar=GrammarMasks(rows=i32([1]), words_per_row=1, bitmask=i32([-1]))),
        dict(prompt_logprobs=PromptLogprobRows(rows=i32([0]), next_ids=i32([-1]), num_top=0)),
        dict(penalties=PenaltyArrays(
            rows=i32([0]), repetition=np.ones(1, np.float32), frequency=np.zeros(1, np.float32), presence=np.zeros(1, np.float32),
            token_offsets=i32([0, 0]), token_ids=i32([]), output_counts=i32([]), bias_offsets=i32([0, 0]), bias_ids=i32([]),
            bias_values=np.zeros(0, np.float32), banned_offsets=i32([0, 0]), banned_ids=i32([]),
        )),
        dict(is_sampled=np.array([True, False])),
        dict(draft_lens=i32([3, 0])),  # more drafts than extend_len - 1
    ],
    ids=["logprobs", "top_logprobs", "grammar", "prompt_logprobs", "penalties", "unsampled", "too_many"],
)
def test_validate_refuses_drafts_on_a_row_that_is_not_plain_decoding(changes):
    drafted().validate(4, 16)
    with pytest.raises(ValueError, match="draft"):
        drafted(**changes).validate(4, 16)


def test_validate_refuses_drafts_on_a_prefill_row():
    batch = drafted_decode_batch(np.random.default_rng(0), [0, 9], [5, 8], [[1, 2], []], page_size=4, num_pages_total=16)
    with pytest.raises(ValueError, match="has drafts but is not a plain decoding row"):
        batch.validate(4, 16)


# --- sampled rows: the distribution is unchanged ------------------------------------------------

VOCAB = 20
NUM_SEEDS = 4000
CACHED_LEN = 5


def processed_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """float64[vocab]: the Sampler's distribution (module docstring of model_proc/sampler.py), from scratch."""
    w = np.exp((logits - logits.max()) / temperature)
    order = np.argsort(-w, kind="stable")
    keep = np.ones_like(w, bool)
    if top_k:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        sorted_w = np.where(keep[order], w[order], 0.0)
        mass = np.cumsum(sorted_w) / sorted_w.sum()
        keep[order[int(np.searchsorted(mass, top_p)) + 1 :]] = False
    keep &= w >= min_p
    p = np.where(keep, w, 0.0)
    return p / p.sum()


def chi_square(tokens: np.ndarray, p: np.ndarray) -> float:
    """Pearson's statistic of `tokens` against p; inf when a token of probability 0 shows up."""
    counts = np.bincount(tokens, minlength=p.size)
    if counts[p == 0].any():
        return float("inf")
    expected = p[p > 0] * tokens.size
    return float(((counts[p > 0] - expected) ** 2 / expected).sum())


def chi_square_bound(p: np.ndarray) -> float:
    """Mean + 6 standard deviations of chi-square with (tokens of p > 0) - 1 degrees of freedom."""
    dof = int((p > 0).sum()) - 1
    return dof + 6 * np.sqrt(2 * dof)


def seeded(params: dict, n: int) -> SamplingArrays:
    """`params` on n rows, seeds 0 .. n - 1."""
    return SamplingArrays(
        temperature=np.full(n, params["temperature"], np.float32), top_k=np.full(n, params["top_k"], np.int32),
        top_p=np.full(n, params["top_p"], np.float32), min_p=np.full(n, params["min_p"], np.float32),
        seed=np.arange(n, dtype=np.int64),
    )


def speculate(logits: np.ndarray, drafts: list[int], params: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NUM_SEEDS rows (seeds 0 ..), each at CACHED_LEN with `drafts`, whose positions have `logits`
    (float32[d + 1, vocab]: the distribution after each accepted prefix), through the runner's
    two calls: the Sampler at the last position, then DraftVerifier. Returns (num_accepted,
    next_token_ids, the first two emitted tokens [n, 2], -1 where not emitted)."""
    d, n = len(drafts), NUM_SEEDS
    batch = drafted_decode_batch(np.random.default_rng(0), [CACHED_LEN] * n, [7] * n, [drafts] * n, 16, n)
    batch.sampling = seeded(params, n)
    sampler = Sampler("cpu")
    rows_logits = torch.from_numpy(logits.astype(np.float32))
    positions = torch.full((n,), CACHED_LEN + 1 + d, dtype=torch.int64)
    token_ids = sampler.sample(rows_logits[d].expand(n, -1).contiguous(), batch.sampling, positions, np.zeros(n, bool))[0].numpy()
    draft_logits = rows_logits[:d].repeat(n, 1)
    num_accepted = DraftVerifier(sampler).verify(draft_logits, batch, token_ids)
    emitted = np.array([(drafts[:a] + [t] + [-1])[:2] for a, t in zip(num_accepted.tolist(), token_ids.tolist(), strict=True)])
    return num_accepted, token_ids, emitted


FILTERS = {
    "temperature": dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),
    "top_k": dict(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0),
    "top_p": dict(temperature=1.2, top_k=0, top_p=None, min_p=0.0),  # top_p: halfway between two cut-offs
    "top_k_top_p_min_p": dict(temperature=1.0, top_k=10, top_p=None, min_p=0.02),
}


def synthetic(name: str, draft_kind: str) -> tuple[np.ndarray, list[int], dict, list[np.ndarray]]:
    """(logits [3, VOCAB], two drafts, sampling parameters, p at each position)."""
    logits = np.random.default_rng(sum(map(ord, name))).normal(0.0, 1.5, (3, VOCAB))
    params = dict(FILTERS[name])
    if params["top_p"] is None:  # keep 7 of the tokens top-k leaves at position 0 (top-p's mass is over those)
        unfiltered = processed_probs(logits[0], params["temperature"], params["top_k"], 1.0, 0.0)
        mass = np.cumsum(np.sort(unfiltered)[::-1])
        params["top_p"] = float((mass[5] + mass[6]) / 2)
    probs = [processed_probs(row, params["temperature"], params["top_k"], params["top_p"], params["min_p"]) for row in logits]
    drafts = []
    for p in probs[:2]:  # a likely draft, a filtered-out one, or the least likely kept token
        order = np.argsort(-p, kind="stable")
        drafts.append(int({"likely": order[1], "filtered_out": order[-1], "unlikely": order[(p > 0).sum() - 1]}[draft_kind]))
    return logits, drafts, params, probs


@pytest.mark.parametrize("draft_kind", ["likely", "unlikely", "filtered_out"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_sampled_drafts_leave_the_distribution_unchanged(name, draft_kind):
    logits, drafts, params, probs = synthetic(name, draft_kind)
    num_accepted, _, emitted = speculate(logits, drafts, params)
    if draft_kind == "filtered_out" and name != "temperature":
        assert probs[0][drafts[0]] == 0 and (num_accepted == 0).all()
    acceptance = (num_accepted >= 1).mean()  # ~ p(draft): min(1, p / q) with q a point mass
    assert abs(acceptance - probs[0][drafts[0]]) < 5 * np.sqrt(max(probs[0][drafts[0]], 1e-3) / NUM_SEEDS) + 1e-9
    assert chi_square(emitted[:, 0], probs[0]) < chi_square_bound(probs[0])
    second = emitted[num_accepted >= 1, 1]  # the token after an accepted first draft is drawn from p at position 1
    if second.size >= 300:
        assert chi_square(second, probs[1]) < chi_square_bound(probs[1])


@pytest.mark.parametrize("name", list(FILTERS))
def test_sampled_drafts_emit_the_very_tokens_of_non_speculative_sampling(name):
    """The same seeds, positions and logits: token for token what the Sampler draws without drafts."""
    logits, drafts, params, _ = synthetic(name, "likely")
    num_accepted, next_ids, emitted = speculate(logits, drafts, params)
    n = NUM_SEEDS
    sampler = Sampler("cpu")
    sampling = seeded(params, n)

    def plain(position_idx: int) -> np.ndarray:
        row = torch.from_numpy(logits[position_idx].astype(np.float32)).expand(n, -1).contiguous()
        positions = torch.full((n,), CACHED_LEN + 1 + position_idx, dtype=torch.int64)
        return sampler.sample(row, sampling, positions, np.zeros(n, bool))[0].numpy()

    first = plain(0)
    assert np.array_equal(emitted[:, 0], first)
    took_draft = first == drafts[0]
    assert np.array_equal(emitted[took_draft, 1], plain(1)[took_draft])
    all_in = num_accepted == 2
    assert np.array_equal(next_ids[all_in], plain(2)[all_in]) and 0 < all_in.sum() < n


# The checker catches broken rules: their first tokens, on the same numbers, with the same uniforms.
def always_accept(p: np.ndarray, draft: int, u: np.ndarray) -> np.ndarray:
    return np.full(u.size, draft)


def no_renormalisation(p: np.ndarray, draft: int, u: np.ndarray) -> np.ndarray:
    """Accept with p(x), but on rejection draw again from p itself (the draft may come back)."""
    again = np.searchsorted(np.cumsum(p), uniform_from_seed(np.arange(u.size), np.full(u.size, 99)), side="right")
    return np.where(u < p[draft], draft, np.minimum(again, p.size - 1))


def never_accept(p: np.ndarray, draft: int, u: np.ndarray) -> np.ndarray:
    """Always draw from the residual (p without the draft, renormalised)."""
    residual = np.where(np.arange(p.size) == draft, 0.0, p)
    return np.minimum(np.searchsorted(np.cumsum(residual / residual.sum()), u, side="right"), p.size - 1)


@pytest.mark.parametrize("broken", [always_accept, no_renormalisation, never_accept])
@pytest.mark.parametrize("name", ["temperature", "top_k_top_p_min_p"])
def test_the_chi_square_check_catches_broken_rules(name, broken):
    logits, drafts, params, probs = synthetic(name, "likely")
    u = uniform_from_seed(np.arange(NUM_SEEDS), np.full(NUM_SEEDS, CACHED_LEN + 1))
    assert chi_square(broken(probs[0], drafts[0], u), probs[0]) > 2 * chi_square_bound(probs[0])  # the bound the tests use, twice
    # and the right rule, on the same uniforms (draw from p, accept if it is the draft), passes
    right = np.minimum(np.searchsorted(np.cumsum(probs[0]), u, side="right"), VOCAB - 1)
    assert chi_square(right, probs[0]) < chi_square_bound(probs[0])
