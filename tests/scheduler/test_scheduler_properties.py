"""Property tests: random arrivals, shared prefixes, identical prompts, n copies, requests under a
grammar (built at once, late, or never), aborts at random moments, and pools small enough that the
estimated KV reservation must retract; with speculative decoding (n-gram drafts) on or off, on a
model whose stream repeats itself (drafts accepted) or not (`echo_period`), and with overlap
scheduling on or off (two steps in flight; the fake worker computes a step only when its result is
taken, so a page freed under a step still in flight is caught).

The harness checks after every call that integrity holds, that every token is what the request's
true sequence gives (so no request ever read a freed or foreign page, and a retracted request
resumed exactly where it was), and that updates follow the rules (usage unchanged by a
retraction); at the end every request has ended exactly once and the pool is free or evictable.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from testing.fake_grammar import FakeGrammar, FakeGrammarSource
from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.scheduler import STEP_POLICIES

VOCAB = 48
EOS = (0, 1)

configs = st.fixed_dictionaries(
    {
        "page_size": st.sampled_from([1, 2, 4]),
        "num_pages": st.integers(6, 40),
        "max_running_requests": st.integers(1, 6),
        "max_prefill_tokens": st.integers(1, 24),
        "context_len": st.integers(4, 64),
        "schedule_policy": st.sampled_from(STEP_POLICIES),
        "admission_policy": st.sampled_from(["fifo", "pack"]),
        "admission_lookahead": st.integers(1, 6),
        "force_fifo_every": st.integers(1, 4),
        "enable_radix_cache": st.booleans(),
        "max_queued_requests": st.integers(1, 30),
        "kv_reservation": st.sampled_from(["estimated", "full"]),
        "prefill_max_requests": st.integers(0, 3),
        "speculative_algorithm": st.sampled_from(["none", "ngram", "ngram"]),
        "speculative_num_draft_tokens": st.integers(1, 6),
        "echo_period": st.sampled_from([0, 3, 5]),
        "overlap_schedule": st.sampled_from(["on", "off"]),
    }
)

GRAMMARS = {  # by spec text: what a constrained submit names
    "now": FakeGrammar(frozenset({5, 6, 7}), num_tokens=3),
    "late": FakeGrammar(frozenset({8, 9}), num_tokens=2, build_polls=3),
    "long": FakeGrammar(frozenset(range(10, 30)), num_tokens=60),
    "bad": FakeGrammar(frozenset(), build_polls=1, error="regex cannot be used: bad"),
}


def grammar_source() -> FakeGrammarSource:
    return FakeGrammarSource(GRAMMARS, stop_ids=frozenset(EOS), vocab_size=VOCAB)


tokens = st.integers(2, VOCAB - 1)
prefixes = st.lists(st.lists(tokens, min_size=1, max_size=12), min_size=1, max_size=3)
submits = st.tuples(
    st.just("submit"),
    st.integers(0, 2),  # which shared prefix (or, past the end, repeat an earlier prompt)
    st.lists(tokens, max_size=10),  # own suffix
    st.one_of(st.none(), st.integers(1, 12)),  # max_tokens (None: up to the context)
    st.booleans(),  # ignore_eos
    st.lists(tokens, max_size=1),  # stop_token_ids
    st.sampled_from([0.0, 0.0, 0.5]),  # frequency_penalty (the fake model ignores it; under overlap the row waits)
)
constrained_submits = st.tuples(
    st.just("submit_constrained"),
    st.integers(0, 2),  # which shared prefix
    st.lists(tokens, max_size=6),  # own suffix
    st.sampled_from(sorted(GRAMMARS)),
    st.integers(1, 3),  # n copies
)
actions = st.lists(
    st.one_of(
        submits,
        submits,
        constrained_submits,
        st.tuples(st.just("step")),
        st.tuples(st.just("step"), st.just("step"), st.just("step")),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("abort_in_flight"), st.integers(0, 30)),
    ),
    min_size=20,
    max_size=80,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, shared=prefixes, script=actions, repeat=st.integers(0, 1000))
def test_random_traffic_keeps_every_invariant_and_drains_clean(config, shared, script, repeat):
    model_keys = ("num_pages", "page_size", "echo_period")
    knobs = {k: v for k, v in config.items() if k not in model_keys}
    h = SchedulerHarness(
        FakeModel(config["num_pages"], config["page_size"], VOCAB, echo_period=config["echo_period"]), eos_token_ids=EOS, seed=1,
        grammar_source=grammar_source(), **knobs,
    )
    play(h, shared, script, repeat)


def play(h: SchedulerHarness, shared: list[list[int]], script: list[tuple], repeat: int) -> None:
    """Run `script` against `h`, then drain; every check the harness makes holds throughout."""
    scheduler = h.scheduler
    prompts: list[list[int]] = []
    for action in script:
        if action[0] == "submit":
            _, which, suffix, max_tokens, ignore_eos, stop, penalty = action
            if which < len(shared) or not prompts:
                prompt = shared[which % len(shared)] + suffix
            else:  # an identical prompt, maybe while the first one is still in the system
                prompt = prompts[repeat % len(prompts)]
            prompts.append(prompt)
            params = SamplingParams(
                max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=tuple(stop), frequency_penalty=penalty,
            )
            h.submit(len(h.prompts), prompt, params)
        elif action[0] == "submit_constrained":
            _, which, suffix, grammar, num_copies = action
            h.submit(len(h.prompts), shared[which % len(shared)] + suffix, SamplingParams(regex=grammar), num_copies)
        elif action[0] == "step":
            for _ in action:
                h.step()
        elif action[0] == "abort" and h.prompts:
            h.abort(action[1] % len(h.prompts))
        elif action[0] == "abort_in_flight" and h.prompts:
            h.step(abort_in_flight=[action[1] % len(h.prompts)])
    h.run(max_steps=5000)
    h.assert_drained()
    stats = scheduler.stats()
    assert stats.num_finished + stats.num_aborted + stats.num_refused == len(h.prompts)
    assert stats.num_retracted == 0 or scheduler._reservation.mode == "estimated"
    if h.grammar_source is not None:  # every grammar started (not refused at submit) went with its request, once
        constrained = [i for i, p in h.params.items() if p.grammar is not None]
        started = [i for i in constrained if h.final[i].code is None or h.final[i].error == GRAMMARS["bad"].error]
        assert sorted(h.grammar_source.released) == started


@settings(max_examples=60, deadline=None)
@given(
    num_identical=st.integers(2, 6),
    prompt=st.lists(tokens, min_size=1, max_size=30),
    page_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 64),
    policy=st.sampled_from(STEP_POLICIES),
    admission=st.sampled_from(["fifo", "pack"]),
    enable_radix_cache=st.booleans(),
)
def test_identical_prompts_together_are_computed_once_and_never_wrongly(
    num_identical, prompt, page_size, budget, policy, admission, enable_radix_cache
):
    h = SchedulerHarness(FakeModel(256, page_size, VOCAB), context_len=64, eos_token_ids=[], max_running_requests=8,
                         max_prefill_tokens=budget, schedule_policy=policy, admission_policy=admission,
                         enable_radix_cache=enable_radix_cache)
    scheduler = h.scheduler
    for i in range(num_identical):
        h.submit(i, prompt, SamplingParams(max_tokens=3, temperature=0.5 * i, seed=i))
    first_step = h.step()
    h.run()
    h.assert_drained()
    assert all(h.outputs[i] == h.outputs[0] for i in range(num_identical))
    computed = scheduler.stats().num_prefilled_tokens
    if len(prompt) <= budget:  # the first completes in the first round: the others take its K/V
        assert computed == len(prompt), computed
        assert {u.req_id for u in first_step} == set(range(num_identical))
        return
    # chunked: the others wait for its pages, then compute the tail a cache hit cannot serve
    # (everything, with the cache off)
    reusable = (len(prompt) - 1) // page_size * page_size if enable_radix_cache else 0
    tail = len(prompt) - reusable
    assert computed >= len(prompt) and (computed - len(prompt)) % tail == 0, computed
    assert computed <= len(prompt) + (num_identical - 1) * tail, computed


# Small pools, long outputs, bursts of arrivals: the estimated reservation admits more than fits
# and must retract. A request may use a half or a third of the pool (the context).
small_pools = st.fixed_dictionaries(
    {
        "page_size": st.sampled_from([2, 4]),
        "num_pages": st.integers(12, 32),
        "context_share": st.sampled_from([2, 3]),
        "max_running_requests": st.integers(3, 8),
        "max_prefill_tokens": st.integers(1, 24),
        "schedule_policy": st.sampled_from(STEP_POLICIES),
        "admission_policy": st.sampled_from(["fifo", "pack"]),
        "enable_radix_cache": st.booleans(),
        "prefill_max_requests": st.integers(0, 2),
        "speculative_algorithm": st.sampled_from(["none", "ngram"]),
        "echo_period": st.sampled_from([0, 4]),
        "overlap_schedule": st.sampled_from(["on", "off"]),
    }
)
long_submits = st.tuples(
    st.just("submit"),
    st.integers(0, 2),
    st.lists(tokens, max_size=4),
    st.one_of(st.none(), st.none(), st.integers(4, 40)),  # max_tokens: mostly up to the context
    st.sampled_from([True] * 9 + [False]),  # ignore_eos: mostly, so outputs run long
    st.just([]),
    st.just(0.0),
)
small_pool_actions = st.lists(
    st.one_of(
        *[long_submits] * 6,
        constrained_submits,
        st.tuples(st.just("step")),
        st.tuples(st.just("step")),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("abort_in_flight"), st.integers(0, 30)),
    ),
    min_size=10,
    max_size=50,
)


def small_pool_harness(config: dict) -> SchedulerHarness:
    knobs = {k: v for k, v in config.items() if k not in ("num_pages", "page_size", "context_share", "echo_period")}
    context_len = config["num_pages"] * config["page_size"] // config["context_share"]
    return SchedulerHarness(
        FakeModel(config["num_pages"], config["page_size"], VOCAB, echo_period=config.get("echo_period", 0)), eos_token_ids=EOS, seed=1,
        context_len=context_len, max_queued_requests=50, grammar_source=grammar_source(), **knobs,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=small_pools, shared=prefixes, script=small_pool_actions, repeat=st.integers(0, 1000))
def test_random_traffic_on_a_small_pool_retracts_and_keeps_every_invariant(config, shared, script, repeat):
    h = small_pool_harness(config)
    play(h, shared, script, repeat)
    target(float(h.scheduler.stats().num_retracted), label="retractions")


@pytest.mark.parametrize("speculative", [False, True])
def test_the_small_pool_traffic_really_retracts(speculative):
    """The property test above would prove little if it never retracted: the same kind of traffic,
    drawn from fixed seeds, retracts in a good share of runs (and keeps every check), also while
    rows carry drafts that get accepted."""
    num_retracting = num_accepting = 0
    for seed in range(40):
        rng = random.Random(seed)
        config = {
            "page_size": rng.choice([2, 4]), "num_pages": rng.randint(12, 32), "context_share": rng.choice([2, 3]),
            "max_running_requests": rng.randint(3, 8), "max_prefill_tokens": rng.randint(1, 24),
            "schedule_policy": rng.choice(STEP_POLICIES), "admission_policy": rng.choice(["fifo", "pack"]),
            "enable_radix_cache": rng.random() < 0.5, "prefill_max_requests": rng.randint(0, 2),
        }
        if speculative:
            config.update(speculative_algorithm="ngram", echo_period=4)
        shared = [[rng.randint(2, VOCAB - 1) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 3))]
        script: list[tuple] = []
        for _ in range(rng.randint(10, 50)):
            kind = rng.choice(["submit"] * 6 + ["step"] * 2 + ["abort", "abort_in_flight"])
            if kind == "submit":
                suffix = [rng.randint(2, VOCAB - 1) for _ in range(rng.randint(0, 4))]
                max_tokens = None if rng.random() < 0.7 else rng.randint(4, 40)
                script.append(("submit", rng.randint(0, 2), suffix, max_tokens, rng.random() < 0.9, [], 0.0))
            elif kind == "step":
                script.append(("step",))
            else:
                script.append((kind, rng.randint(0, 30)))
        h = small_pool_harness(config)
        play(h, shared, script, rng.randint(0, 1000))
        num_retracting += h.scheduler.stats().num_retracted > 0
        num_accepting += h.scheduler.stats().num_accepted_tokens > 0
    assert num_retracting >= 8, f"only {num_retracting} of 40 runs retracted"
    assert num_accepting >= 20 * speculative, f"only {num_accepting} of 40 runs accepted drafts"
