"""Property tests: random arrivals, shared prefixes, identical prompts, aborts at random moments.

The harness checks after every call that integrity holds, that every token is what the request's
true sequence gives (so no request ever read a freed or foreign page), and that updates follow
the rules; at the end every request has ended exactly once and the pool is free or evictable.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.sampling_params import SamplingParams
from scheduler_proc.scheduler import STEP_POLICIES
from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness

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
    }
)

tokens = st.integers(2, VOCAB - 1)
prefixes = st.lists(st.lists(tokens, min_size=1, max_size=12), min_size=1, max_size=3)
submits = st.tuples(
    st.just("submit"),
    st.integers(0, 2),  # which shared prefix (or, past the end, repeat an earlier prompt)
    st.lists(tokens, max_size=10),  # own suffix
    st.integers(1, 12),  # max_tokens
    st.booleans(),  # ignore_eos
    st.lists(tokens, max_size=1),  # stop_token_ids
)
actions = st.lists(
    st.one_of(
        submits,
        submits,
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
    model_keys = ("num_pages", "page_size")
    knobs = {k: v for k, v in config.items() if k not in model_keys}
    h = SchedulerHarness(FakeModel(config["num_pages"], config["page_size"], VOCAB), eos_token_ids=EOS, seed=1, **knobs)
    scheduler = h.scheduler
    prompts: list[list[int]] = []
    for action in script:
        if action[0] == "submit":
            _, which, suffix, max_tokens, ignore_eos, stop = action
            if which < len(shared) or not prompts:
                prompt = shared[which % len(shared)] + suffix
            else:  # an identical prompt, maybe while the first copy is still in the system
                prompt = prompts[repeat % len(prompts)]
            prompts.append(prompt)
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=tuple(stop))
            h.submit(len(h.prompts), prompt, params)
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


@settings(max_examples=60, deadline=None)
@given(
    num_copies=st.integers(2, 6),
    prompt=st.lists(tokens, min_size=1, max_size=30),
    page_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 64),
    policy=st.sampled_from(STEP_POLICIES),
    admission=st.sampled_from(["fifo", "pack"]),
    enable_radix_cache=st.booleans(),
)
def test_identical_prompts_together_are_computed_once_and_never_wrongly(
    num_copies, prompt, page_size, budget, policy, admission, enable_radix_cache
):
    h = SchedulerHarness(FakeModel(256, page_size, VOCAB), context_len=64, eos_token_ids=[], max_running_requests=8,
                         max_prefill_tokens=budget, schedule_policy=policy, admission_policy=admission,
                         enable_radix_cache=enable_radix_cache)
    scheduler = h.scheduler
    for i in range(num_copies):
        h.submit(i, prompt, SamplingParams(max_tokens=3, temperature=0.5 * i, seed=i))
    first_step = h.step()
    h.run()
    h.assert_drained()
    assert all(h.outputs[i] == h.outputs[0] for i in range(num_copies))
    computed = scheduler.stats().num_prefilled_tokens
    if len(prompt) <= budget:  # the first copy completes in the first round: the others copy it
        assert computed == len(prompt), computed
        assert {u.req_id for u in first_step} == set(range(num_copies))
        return
    # chunked: the copies wait for its pages, then compute the tail a cache hit cannot serve
    # (everything, with the cache off)
    reusable = (len(prompt) - 1) // page_size * page_size if enable_radix_cache else 0
    tail = len(prompt) - reusable
    assert computed >= len(prompt) and (computed - len(prompt)) % tail == 0, computed
    assert computed <= len(prompt) + (num_copies - 1) * tail, computed
