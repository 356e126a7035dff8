"""Scheduler through its public interface, against the FakeModel, with exact expectations."""

import numpy as np
import pytest

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams

VOCAB = 64
NO_EOS = [1000]  # outside the fake vocabulary: nothing stops early unless a test says so
# Tests that assert the exact shape of each step name the policy they describe; the rest run the
# server's defaults (ServerConfig).
PREFILL_FIRST_FIFO = {"schedule_policy": "prefill-first", "admission_policy": "fifo"}


def make(num_pages=64, page_size=4, max_running_requests=8, max_prefill_tokens=16, context_len=128, eos_token_ids=NO_EOS, **kw):
    return SchedulerHarness(
        FakeModel(num_pages, page_size, VOCAB), context_len=context_len, eos_token_ids=eos_token_ids,
        max_running_requests=max_running_requests, max_prefill_tokens=max_prefill_tokens, **kw,
    )


def oracle(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(FakeModel.next_token(seq, VOCAB))
    return seq[len(prompt):]


def p(max_tokens=4, **kw):
    return SamplingParams(max_tokens=max_tokens, **kw)


def prompt(start, n):
    return list(range(start, start + n))


def shape(batch):
    return batch.extend_lens.tolist(), batch.cached_lens.tolist(), batch.is_sampled.tolist()


def test_chunks_in_order_and_the_chunked_req_continues_before_a_newer_request():
    h = make(page_size=4, max_prefill_tokens=8, **PREFILL_FIRST_FIFO)
    h.submit(1, prompt(100, 19), p())
    h.step()
    h.submit(2, prompt(200, 6), p())
    h.run()
    b = h.batches
    assert shape(b[0]) == ([8], [0], [False])
    assert shape(b[1]) == ([8], [8], [False])  # request 2 waits: the ChunkedReq takes the budget first
    assert shape(b[2]) == ([3, 5], [16, 0], [True, False])  # then request 2 fills the rest, chunked
    assert shape(b[3]) == ([1], [5], [True])  # its continuation (prefill-first: before any decode)
    assert shape(b[4]) == ([1, 1], [19, 6], [True, True])
    assert b[0].page_ids.tolist() == [0, 1] and b[1].page_ids.tolist() == [0, 1, 2, 3]
    assert b[2].page_ids.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert b[4].page_ids.tolist() == [0, 1, 2, 3, 4, 5, 6]  # 20 and 7 tokens: no new page yet
    assert b[5].page_ids.tolist() == [0, 1, 2, 3, 4, 7, 5, 6]  # request 1 writes its 21st token: page 7
    assert len(b) == 7
    h.assert_drained()


def test_a_prefix_hit_reuses_exactly_the_matched_pages():
    h = make(page_size=4)
    a = prompt(1, 10)
    h.submit(1, a, p(max_tokens=3))
    h.run()
    out = h.outputs[1]
    assert h.batches[0].page_ids.tolist() == [0, 1, 2]
    h.submit(2, a[:8] + [60, 61], p(max_tokens=1))
    h.step()
    assert shape(h.batches[-1]) == ([2], [8], [True]) and h.batches[-1].page_ids.tolist() == [0, 1, 3]
    assert h.final[2].num_cached_tokens == 8
    h.submit(3, a + out[:2] + [62], p(max_tokens=1))  # request 1's KV covers prompt + 2 outputs: 3 pages
    h.step()
    assert shape(h.batches[-1]) == ([1], [12], [True]) and h.batches[-1].page_ids.tolist() == [0, 1, 2, 3]
    assert h.final[3].num_cached_tokens == 12
    stats = h.scheduler.stats()
    assert stats.num_prefix_hit_tokens == 20 and stats.num_prompt_tokens == 10 + 10 + 13
    h.assert_drained()


def test_pages_a_request_gets_and_the_lru_eviction_order():
    h = make(num_pages=6, page_size=2)
    for i, start in enumerate((1, 5, 9)):  # three cached prompts of 2 pages each fill the pool
        h.submit(i, prompt(start, 4), p(max_tokens=1))
        h.step()
    assert [b.page_ids.tolist() for b in h.batches] == [[0, 1], [2, 3], [4, 5]]
    s = h.scheduler.stats()
    assert (s.num_free_pages, s.num_cached_pages, s.num_evictable_pages) == (0, 6, 6)
    h.submit(3, prompt(1, 4) + [13, 14], p(max_tokens=1))  # hits [1..4]; evicts the LRU leaf [5..8]
    h.step()
    assert h.batches[-1].page_ids.tolist() == [0, 1, 2] and h.batches[-1].cached_lens.tolist() == [4]
    assert h.scheduler.stats().num_free_pages == 1  # page 3 of the evicted leaf
    h.submit(4, prompt(20, 6), p(max_tokens=1))  # needs 3 pages: free page 3, then evicts [9..12]
    h.step()
    assert h.batches[-1].page_ids.tolist() == [4, 5, 3]
    h.assert_drained()


@pytest.mark.parametrize("enable_radix_cache", [True, False])
@pytest.mark.parametrize("admission_policy", ["fifo", "pack"])
@pytest.mark.parametrize("schedule_policy", ["prefill-first", "decode-first", "mixed"])
def test_identical_prompts_arriving_together_are_computed_once(schedule_policy, admission_policy, enable_radix_cache):
    h = make(page_size=4, max_prefill_tokens=18, schedule_policy=schedule_policy, admission_policy=admission_policy,
             enable_radix_cache=enable_radix_cache)
    same = prompt(7, 18)
    for i in range(8):
        h.submit(i, same, p(max_tokens=3, temperature=0.1 * i, seed=100 + i))
    first = h.step()
    b = h.batches[0]
    assert shape(b) == ([18] * 8, [0] * 8, [True] * 8)  # 8 identical prompts, all in the first step
    assert b.kv_source.tolist() == [0] * 8 and b.input_ids.tolist() == same  # computed once ...
    assert b.page_ids.tolist() == list(range(40))  # ... into 5 pages each
    assert b.sampling.seed.tolist() == [100 + i for i in range(8)]  # each samples its own
    assert b.sampling.temperature.tolist() == pytest.approx([0.1 * i for i in range(8)])
    assert sorted(u.req_id for u in first) == list(range(8))  # every first token now
    stats = h.scheduler.stats()
    assert stats.num_prefilled_tokens == 18 and stats.num_prompt_tokens == 8 * 18 and stats.num_prefix_hit_tokens == 0
    if enable_radix_cache:  # the sharers hold the source's 4 full pages, and own their partial page
        assert (stats.num_cached_pages, stats.num_used_pages) == (4, 8)
    else:
        assert (stats.num_cached_pages, stats.num_used_pages) == (0, 40)
    h.run()
    assert all(h.outputs[i] == oracle(same, 3) for i in range(8))
    assert h.scheduler.stats().num_prefilled_tokens == 18
    h.assert_drained()


def test_identical_prompts_after_a_prefix_hit_and_next_to_running_requests_in_a_mixed_step():
    h = make(page_size=4, max_prefill_tokens=16, schedule_policy="mixed", admission_policy="fifo")
    head = prompt(1, 8)
    h.submit(0, head + [40, 41], p(max_tokens=6))
    h.step()  # 0 prefills; its first 8 tokens (2 pages) go to the cache
    same = head + [50, 51, 52]
    for i in (1, 2, 3):
        h.submit(i, same, p(max_tokens=2))
    h.submit(4, head + [60], p(max_tokens=2))  # shares only the cached prefix: computed
    h.step()
    b = h.batches[1]
    assert shape(b) == ([1, 3, 3, 3, 1], [10, 8, 8, 8, 8], [True] * 5)  # 0 decodes; 1, 2, 3 after the hit
    assert b.kv_source.tolist() == [0, 1, 1, 1, 4] and b.input_ids.tolist() == [h.outputs[0][0], 50, 51, 52, 60]
    assert b.page_ids.tolist() == [0, 1, 2] + [0, 1, 3] + [0, 1, 4] + [0, 1, 5] + [0, 1, 6]
    assert h.scheduler.stats().num_prefilled_tokens == 10 + 3 + 1
    h.run()
    assert all(h.outputs[i] == oracle(same, 2) for i in (1, 2, 3)) and h.outputs[4] == oracle(head + [60], 2)
    h.assert_drained()


def test_a_prompt_that_shares_only_a_prefix_waits_for_the_page_computed_in_this_step():
    h = make(page_size=4, max_prefill_tokens=64, **PREFILL_FIRST_FIFO)
    h.submit(1, prompt(7, 18), p(max_tokens=2))
    h.submit(2, prompt(7, 17) + [60], p(max_tokens=2))
    h.step()
    assert shape(h.batches[0]) == ([18], [0], [True])  # 2 waits one step for the cache ...
    h.step()
    assert shape(h.batches[1]) == ([2], [16], [True]) and h.batches[1].kv_source is None  # ... then hits 16
    h.run()
    assert h.outputs[2] == oracle(prompt(7, 17) + [60], 2)
    h.assert_drained()


@pytest.mark.parametrize("enable_radix_cache", [True, False])
def test_a_kv_sharer_aborted_in_flight_is_freed_and_the_others_go_on(enable_radix_cache):
    h = make(page_size=4, max_prefill_tokens=32, enable_radix_cache=enable_radix_cache, **PREFILL_FIRST_FIFO)
    same = prompt(7, 10)
    for i in range(3):
        h.submit(i, same, p(max_tokens=4))
    updates = h.step(abort_in_flight=[1])
    assert h.batches[0].kv_source.tolist() == [0, 0, 0] and sorted(u.req_id for u in updates) == [0, 2]
    assert h.final[1].finish_reason == FinishReason.ABORT and h.outputs[1] == []
    assert h.scheduler.stats().num_used_pages == (2 if enable_radix_cache else 6)  # 1's 3 pages are free
    h.run()
    assert h.outputs[0] == h.outputs[2] == oracle(same, 4)
    h.assert_drained()


@pytest.mark.parametrize("enable_radix_cache", [True, False])
def test_a_kv_source_aborted_in_flight_still_gives_its_sharers_their_kv_and_first_token(enable_radix_cache):
    """The worker runs the whole batch anyway; the source's pages are freed only in on_result, after
    the sharers got theirs, and with the cache on its full pages stay in the tree for them."""
    h = make(page_size=4, max_prefill_tokens=32, enable_radix_cache=enable_radix_cache, **PREFILL_FIRST_FIFO)
    same = prompt(7, 10)
    for i in range(3):
        h.submit(i, same, p(max_tokens=4))
    updates = h.step(abort_in_flight=[0])
    assert h.batches[0].kv_source.tolist() == [0, 0, 0] and sorted(u.req_id for u in updates) == [1, 2]
    assert h.final[0].finish_reason == FinishReason.ABORT and h.outputs[0] == []
    stats = h.scheduler.stats()
    assert (stats.num_cached_pages, stats.num_used_pages) == ((2, 2) if enable_radix_cache else (0, 6))
    h.run()
    assert h.outputs[1] == h.outputs[2] == oracle(same, 4)
    h.assert_drained()


def test_finish_on_any_eos_id_stop_token_or_max_tokens():
    pr = prompt(3, 5)
    seq = oracle(pr, 8)
    eos = [seq[3], 1000]
    h = make(eos_token_ids=eos)
    h.submit(1, pr, p(max_tokens=8))
    h.submit(2, pr, p(max_tokens=8, ignore_eos=True))
    h.submit(3, pr, p(max_tokens=8, ignore_eos=True, stop_token_ids=(seq[5],)))
    h.submit(4, pr, p(max_tokens=2))
    h.run()
    cut = seq.index(seq[3]) + 1  # the first occurrence of the EOS id ends it
    assert h.outputs[1] == seq[:cut] and h.final[1].finish_reason == FinishReason.STOP
    assert h.outputs[2] == seq and h.final[2].finish_reason == FinishReason.LENGTH
    assert h.outputs[3] == seq[: seq.index(seq[5]) + 1] and h.final[3].finish_reason == FinishReason.STOP
    assert h.outputs[4] == seq[:2] and h.final[4].finish_reason == FinishReason.LENGTH
    h.assert_drained()


def test_max_tokens_beyond_the_context_is_refused_and_none_means_up_to_the_context():
    h = make(context_len=16)
    (u,) = h.submit(1, prompt(1, 10), p(max_tokens=7))
    assert u.finish_reason == FinishReason.ERROR and u.code == ErrorCode.INVALID and u.error == (
        "This model's maximum context length is 16 tokens. However, you requested 17 tokens "
        "(10 in the prompt, 7 in the completion). Please reduce the length of the prompt or completion."
    )
    h.submit(2, prompt(1, 10), p(max_tokens=6))
    h.submit(3, prompt(1, 10), SamplingParams())  # no max_tokens: up to the context
    h.run()
    assert h.outputs[2] == h.outputs[3] == oracle(prompt(1, 10), 6)
    assert h.final[2].finish_reason == h.final[3].finish_reason == FinishReason.LENGTH
    h.assert_drained()


@pytest.mark.parametrize(
    ("ids", "max_tokens", "message"),
    [
        ([], 4, "empty prompt"),
        (prompt(1, 16), 4, "leaves no room for output in the context of 16"),
        (prompt(1, 10), 6, "needs 4 KV pages of 4 tokens; the whole pool has 3"),
    ],
)
def test_a_request_that_can_never_run_is_refused_at_once_with_a_reason(ids, max_tokens, message):
    h = make(num_pages=3, context_len=16)
    (u,) = h.submit(1, ids, p(max_tokens=max_tokens))
    assert (u.finish_reason, u.code) == (FinishReason.ERROR, ErrorCode.INVALID) and message in u.error and u.token_ids.tolist() == []
    assert not h.scheduler.has_work and h.scheduler.stats().num_refused == 1
    h.submit(2, prompt(1, 3), p(max_tokens=2))  # 4 tokens of KV fit in one page
    h.run()
    h.assert_drained()


def test_without_max_tokens_a_request_runs_up_to_the_pool_when_it_is_smaller_than_the_context():
    """A pool of 3 pages of 4 tokens (12 tokens of KV) under a context of 16: a 5-token prompt with
    no max_tokens gets 8 tokens (5 + 8 - 1 = 12 of KV), ends with length, and nothing leaks; a
    prompt the pool cannot hold at all is still refused."""
    h = make(num_pages=3, context_len=16)
    h.submit(1, prompt(1, 5), SamplingParams())
    h.run()
    assert h.outputs[1] == oracle(prompt(1, 5), 8) and h.final[1].finish_reason == FinishReason.LENGTH
    (u,) = h.submit(2, prompt(1, 13), SamplingParams())
    assert u.code == ErrorCode.INVALID and "the whole pool has 3" in u.error
    h.assert_drained()


def test_a_full_queue_answers_server_busy_and_duplicate_ids_are_refused():
    h = make(max_queued_requests=2)
    assert h.submit(1, prompt(1, 4)) == [] and h.submit(2, prompt(1, 4)) == []
    (busy,) = h.submit(3, prompt(1, 4))
    assert (busy.finish_reason, busy.code) == (FinishReason.ERROR, ErrorCode.BUSY) and "server busy: 2 requests waiting" in busy.error
    (dup,) = h.scheduler.submit(1, prompt(9, 4), p())
    assert (dup.finish_reason, dup.code) == (FinishReason.ERROR, ErrorCode.INTERNAL) and "duplicate req_id 1" in dup.error
    h.run()
    assert h.final[1].finish_reason == h.final[2].finish_reason == FinishReason.LENGTH
    h.assert_drained()


def test_abort_in_every_state():
    h = make(page_size=4, max_prefill_tokens=8)
    h.submit(1, prompt(1, 20), p(max_tokens=8))  # chunked: 8 + 8 + 4
    h.submit(2, prompt(30, 4), p(max_tokens=8))
    (u,) = h.abort(2)  # waiting
    assert (u.req_id, u.finish_reason, u.token_ids.tolist()) == (2, FinishReason.ABORT, [])
    h.step()
    (u,) = h.abort(1)  # between chunks: freed at once
    assert u.finish_reason == FinishReason.ABORT and h.scheduler.stats().num_used_pages == 0
    h.submit(3, prompt(40, 5), p(max_tokens=8))
    h.step()
    h.step()
    h.abort(3)  # running
    assert h.final[3].finish_reason == FinishReason.ABORT and h.scheduler.stats().num_running == 0
    assert h.abort(3) == [] and h.abort(99) == []  # already ended, unknown
    h.submit(4, prompt(50, 3), p(max_tokens=1))
    h.step()
    assert h.final[4].finish_reason == FinishReason.LENGTH and h.abort(4) == []  # just finished
    assert [b.extend_lens.tolist() for b in h.batches] == [[8], [5], [1], [3]]  # 2 never ran, 1 stopped after a chunk
    h.assert_drained()


def test_abort_while_in_flight_frees_after_the_step_and_sends_nothing_after():
    h = make(page_size=4, max_prefill_tokens=8, **PREFILL_FIRST_FIFO)
    s = h.scheduler
    h.submit(1, prompt(1, 20), p(max_tokens=8))
    h.submit(2, prompt(30, 6), p(max_tokens=8))
    h.step()  # 1: chunk of 8
    batch = s.next_batch()  # 1: second chunk, in flight
    h.batches.append(batch)
    (u,) = h.abort(1)
    assert u.finish_reason == FinishReason.ABORT
    stats = s.stats()
    assert (stats.num_used_pages, stats.num_cached_pages, stats.num_free_pages) == (2, 2, 60)  # held: the worker writes them
    updates = s.on_result(h.model.forward(batch))
    h._record(updates)
    assert updates == [] and s.stats().num_used_pages == 0
    assert s.stats().num_cached_pages == 4  # the 16 computed tokens are kept for others
    h.step()  # 2 prefills
    updates = h.step(abort_in_flight=[2])  # 2 decodes while aborted: the token is dropped
    assert updates == [] and h.final[2].finish_reason == FinishReason.ABORT and len(h.outputs[2]) == 1
    assert h.abort(2) == []
    h.assert_drained()


def test_seeds_are_drawn_reproducibly_and_logprobs_follow_the_request():
    def seeds(seed):
        h = make(seed=seed)
        h.submit(1, prompt(1, 4), p(seed=None))
        h.submit(2, prompt(1, 4), p(seed=77, return_logprob=True))
        h.submit(3, prompt(9, 4), p(seed=None))
        h.step()
        b = h.batches[0]
        h.run()
        assert h.first[2].logprobs == [-0.5] and h.first[1].logprobs is None
        return b.sampling.seed.tolist(), b.return_logprob.tolist()

    a, logprob = seeds(0)
    assert seeds(0)[0] == a and a[1] == 77 and len(set(a)) == 3
    assert seeds(1)[0][0] != a[0]
    assert logprob == [False, True, False]


def test_sampling_params_reach_the_batch_in_batch_order():
    h = make()
    h.submit(1, prompt(1, 4), p(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1))
    h.submit(2, prompt(9, 4), p())
    h.step()
    s = h.batches[0].sampling
    assert s.temperature.tolist() == pytest.approx([0.7, 0.0]) and s.top_k.tolist() == [5, 0]
    assert s.top_p.tolist() == pytest.approx([0.9, 1.0]) and s.min_p.tolist() == pytest.approx([0.1, 0.0])


def _policy_run(policy):
    h = make(page_size=4, max_prefill_tokens=8, schedule_policy=policy)
    h.submit(1, prompt(1, 8), p(max_tokens=6))
    h.step()
    h.submit(2, prompt(20, 6), p(max_tokens=6))
    h.submit(3, prompt(40, 6), p(max_tokens=6))
    h.step()
    h.step()
    h.step()
    h.run()
    h.assert_drained()
    return [shape(b)[:2] for b in h.batches[1:4]]


def test_prefill_first_prefills_whenever_it_can():
    assert _policy_run("prefill-first") == [([6, 2], [0, 0]), ([4], [2]), ([1, 1, 1], [8, 6, 6])]


def test_decode_first_puts_a_decode_step_between_prefill_steps():
    assert _policy_run("decode-first") == [([1], [8]), ([6, 2], [0, 0]), ([1, 1], [9, 6])]


def test_mixed_shares_one_budget_between_decode_tokens_and_prefill_chunks():
    assert _policy_run("mixed") == [([1, 6, 1], [8, 0, 0]), ([1, 1, 5], [9, 6, 1]), ([1, 1, 1], [10, 7, 6])]


def test_idle_scheduler_builds_nothing():
    h = make()
    assert h.scheduler.next_batch() is None and not h.scheduler.has_work
    h.scheduler.check_integrity()


def test_bad_constructor_values_are_refused():
    with pytest.raises(ValueError, match="schedule policy"):
        make(schedule_policy="random")
    with pytest.raises(ValueError, match="admission policy"):
        make(admission_policy="lifo")
    with pytest.raises(ValueError, match="num_pages"):
        make(num_pages=0)


def test_disabled_radix_cache_computes_everything_and_keeps_nothing():
    h = make(enable_radix_cache=False)
    for i in range(3):
        h.submit(i, prompt(1, 12), p(max_tokens=3))
    h.run()
    assert h.scheduler.stats().num_prefix_hit_tokens == 0 and h.scheduler.stats().num_cached_pages == 0
    assert all(h.outputs[i] == oracle(prompt(1, 12), 3) for i in range(3))
    h.assert_drained()
    assert np.all(h.scheduler.stats().num_free_pages == 64)


def test_abort_with_a_finish_reason_reports_it_and_stats_add_up():
    h = make(context_len=16)
    h.submit(1, prompt(1, 6), p(max_tokens=None))  # up to the context: 10
    h.step()
    (u,) = h.abort(1, FinishReason.STOP)  # the detokenizer found a stop string
    assert (u.finish_reason, u.code) == (FinishReason.STOP, None)
    h.submit(2, prompt(1, 6), p(max_tokens=10))
    (u,) = h.abort(2)  # waiting
    assert (u.finish_reason, u.num_cached_tokens) == (FinishReason.ABORT, 0)
    h.submit(3, prompt(1, 9), p(max_tokens=3))
    h.run()
    s = h.scheduler.stats()
    assert (s.num_submitted, s.num_finished, s.num_aborted, s.num_refused) == (3, 2, 1, 0)  # a stop-string end counts as finished
    assert s.num_prompt_tokens == 6 + 9 and s.num_prefix_hit_tokens == 4  # request 1 cached one page
    assert s.num_prefilled_tokens == 6 + 5 and s.num_decoded_tokens == 2 and s.num_generated_tokens == 1 + 3
    h.assert_drained()


def test_prefill_max_requests_caps_the_new_requests_of_each_round():
    h = make(prefill_max_requests=2, **PREFILL_FIRST_FIFO)
    for i in range(5):
        h.submit(i, prompt(10 * i + 1, 3), p(max_tokens=2))
    h.run()
    prefill_rounds = [b.extend_lens.tolist() for b in h.batches if (b.extend_lens > 1).any()]
    assert prefill_rounds == [[3, 3], [3, 3], [3]]
    assert all(h.outputs[i] == oracle(prompt(10 * i + 1, 3), 2) for i in range(5))
    h.assert_drained()
    with pytest.raises(ValueError, match="prefill_max_requests"):
        make(prefill_max_requests=-1)


@pytest.mark.parametrize("num_rows", [128, 256])
def test_hundreds_of_concurrent_tiny_requests_run_at_once(num_rows):
    h = make(num_pages=4 * num_rows, page_size=4, max_running_requests=num_rows, max_prefill_tokens=8192,
             max_queued_requests=num_rows, admission_policy="fifo")  # pack looks at 64 a round
    for i in range(num_rows):
        h.submit(i, [i % 60 + 2, 1, i // 60 + 2], p(max_tokens=5))
    h.run()
    stats = h.scheduler.stats()
    assert stats.num_running_peak == num_rows and stats.num_finished == num_rows and stats.num_retracted == 0
    assert len(h.batches) == 5  # one prefill round for all, then four decode steps
    assert all(len(h.outputs[i]) == 5 for i in range(num_rows))
    h.assert_drained()
