"""Estimated KV reservation and retraction, with exact expectations.

The harness checks every token against the request's true sequence, so a retracted request that
resumed from the wrong place, read a freed page or repeated a token would fail there; these tests
pin down who is retracted, when, and what the queue, the cache and the stats hold after.
"""

import logging

import numpy as np
import pytest

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.kv_reservation import CLIP_TOKENS, KvReservation
from zserve.scheduler_proc.req import PendingReq

VOCAB = 64
NO_EOS = [1000]
SHORT, LONG = [5, 6, 7], [1, 2, 3, 4]


def make(num_pages, page_size=2, **kw):
    kw = {"context_len": 64, "max_running_requests": 8, "max_prefill_tokens": 16, "admission_policy": "fifo", **kw}
    return SchedulerHarness(FakeModel(num_pages, page_size, VOCAB), eos_token_ids=NO_EOS, **kw)


def oracle(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(FakeModel.next_token(seq, VOCAB))
    return seq[len(prompt):]


def shape(batch):
    return batch.extend_lens.tolist(), batch.cached_lens.tolist()


def two_requests(h, max_tokens=8, seed=None):
    """Request 1 (3 prompt tokens) and 2 (4): 5 + 6 pages of 2 tokens at most, in a pool of 10.
    Each reserves 5 pages at ratio 0.7, so both are admitted at once; request 2 outgrows that."""
    h.submit(1, SHORT, SamplingParams(max_tokens=max_tokens, seed=seed))
    h.submit(2, LONG, SamplingParams(max_tokens=max_tokens, seed=seed))


def test_a_decode_step_short_of_pages_retracts_the_newest_which_resumes_as_a_prefix_hit(caplog):
    h = make(num_pages=10)
    s = h.scheduler
    two_requests(h, seed=5)
    for _ in range(7):  # both run; request 2's 7th output token fills its 5th page, the pool is full
        h.step()
    assert [shape(b) for b in h.batches[:2]] == [([3, 4], [0, 0]), ([1, 1], [3, 4])]
    assert s.stats().num_free_pages == 0 and len(h.outputs[2]) == 7
    with caplog.at_level(logging.INFO, logger="zserve.scheduler_proc.scheduler"):
        batch = s.next_batch()  # request 2 needs an 11th slot: it is the newest, so it goes
    assert "req 2 retracted: 10 of its 11 tokens kept in the cache, 1 running" in caplog.text
    assert shape(batch) == ([1], [9])  # request 1 alone decodes
    stats = s.stats()
    assert (stats.num_retracted, stats.num_running, stats.num_waiting, stats.num_free_pages) == (1, 1, 1, 0)
    assert stats.new_token_ratio == pytest.approx(0.7)  # back up to where it started
    (pending,) = s._pending.ready
    assert isinstance(pending, PendingReq) and pending.req_id == 2
    assert pending.input_ids.tolist() == LONG + oracle(LONG, 7) and pending.output_ids == oracle(LONG, 7)
    assert (pending.num_orig_prompt_tokens, pending.max_tokens, pending.seed) == (4, 8, 5)
    h.batches.append(batch)
    h._record(s.on_result(h.model.forward(batch)))  # request 1 finishes: 8 output tokens
    assert h.final[1].finish_reason == FinishReason.LENGTH and 2 not in h.final
    h.step()  # request 2 again: its 11 tokens are a prefix hit of 10, it computes the last one
    again = h.batches[-1]
    assert shape(again) == ([1], [10]) and again.is_sampled.tolist() == [True]
    # its seed, and the position its 8th token is drawn at, are those of a run that never retracts
    assert again.sampling.seed.tolist() == [5] and int(again.cached_lens[0] + again.extend_lens[0]) == len(LONG) + 7
    h.run()
    assert h.outputs[2] == oracle(LONG, 8) and h.outputs[1] == oracle(SHORT, 8)
    assert (h.final[2].finish_reason, h.final[2].num_cached_tokens) == (FinishReason.LENGTH, 0)
    stats = s.stats()
    assert stats.num_retracted == 1 and stats.num_finished == 2 and stats.num_generated_tokens == 16
    assert stats.num_prompt_tokens == 3 + 4 + 11 and stats.num_prefix_hit_tokens == 10  # the re-admission counts again
    h.assert_drained()


@pytest.mark.parametrize("policy", ["mixed", "prefill-first", "decode-first"])
def test_outputs_equal_a_run_on_a_big_pool(policy):
    runs = {}
    for num_pages in (10, 64):
        h = make(num_pages, schedule_policy=policy)
        two_requests(h, max_tokens=8)
        h.submit(3, [9, 9, 8], SamplingParams(max_tokens=6))
        h.run()
        h.assert_drained()
        runs[num_pages] = (h.outputs, h.scheduler.stats().num_retracted)
    assert runs[10][0] == runs[64][0]
    assert runs[10][1] >= 1 and runs[64][1] == 0


def test_the_full_reservation_never_retracts_it_admits_less():
    h = make(num_pages=10, kv_reservation="full")
    two_requests(h)
    h.step()
    assert shape(h.batches[0]) == ([3], [0])  # request 2's 6 pages do not fit beside request 1's 5
    h.run()
    assert shape(h.batches[8]) == ([4], [0])  # it starts once request 1 is done
    assert h.scheduler.stats().num_retracted == 0 and h.outputs[2] == oracle(LONG, 8)
    h.assert_drained()


def test_with_the_cache_disabled_a_retracted_request_recomputes_everything():
    h = make(num_pages=10, enable_radix_cache=False)
    two_requests(h)
    h.run()
    stats = h.scheduler.stats()
    assert stats.num_retracted == 1 and stats.num_prefix_hit_tokens == 0 and stats.num_cached_pages == 0
    assert shape(h.batches[8]) == ([11], [0])
    assert h.outputs[2] == oracle(LONG, 8)
    h.assert_drained()


def test_a_retracted_request_can_be_aborted_while_it_waits():
    h = make(num_pages=10)
    two_requests(h)
    for _ in range(8):
        h.step()
    assert h.scheduler.stats().num_retracted == 1 and h.scheduler.stats().num_waiting == 1
    (u,) = h.abort(2)
    assert (u.finish_reason, u.token_ids.tolist(), u.num_cached_tokens) == (FinishReason.ABORT, [], 0)
    assert len(h.outputs[2]) == 7
    h.run()
    h.assert_drained()


def test_the_oldest_running_request_is_never_retracted_the_chunked_req_gives_way(caplog):
    """Request 1 runs alone and grows; request 2's prompt is chunked one token a step beside it.
    When request 1 needs a page and only request 2's pages are left, request 2 goes."""
    h = make(num_pages=24, max_prefill_tokens=2, schedule_policy="mixed")
    s = h.scheduler
    h.submit(1, [1, 2], SamplingParams(max_tokens=40))
    for _ in range(28):
        h.step()
    h.submit(2, list(range(10, 20)), SamplingParams(max_tokens=1))
    for _ in range(9):  # request 2: one prompt token a step
        h.step()
    assert shape(h.batches[-1]) == ([1, 1], [37, 8]) and s.stats().num_free_pages == 0
    with caplog.at_level(logging.INFO, logger="zserve.scheduler_proc.scheduler"):
        h.step()
    assert "req 2 retracted: 8 of its 10 tokens kept in the cache, 1 running" in caplog.text
    assert shape(h.batches[-1]) == ([1], [38]) and s.stats().num_prefilling == 0
    h.run()
    assert shape(h.batches[40]) == ([2], [6])  # request 2 again, after request 1: 6 of its 8 cached tokens left
    assert h.outputs[1] == oracle([1, 2], 40) and h.outputs[2] == oracle(list(range(10, 20)), 1)
    assert s.stats().num_retracted == 1
    h.assert_drained()


@pytest.mark.parametrize("num_top", [0, 2])
def test_a_chunked_req_that_gives_way_still_sends_its_prompt_logprobs(num_top):
    """Echo on a ChunkedReq that is retracted mid-prompt: its re-admission scores the whole prompt again (the
    partial scores of the first admission are dropped), and the first token carries every prompt logprob once."""
    h = make(num_pages=24, max_prefill_tokens=2, schedule_policy="mixed")
    h.submit(1, [1, 2], SamplingParams(max_tokens=40))
    for _ in range(28):
        h.step()
    prompt = list(range(10, 20))
    h.submit(2, prompt, SamplingParams(max_tokens=1, prompt_logprobs=num_top))
    for _ in range(10):  # nine chunks of one token, then request 2 gives way
        h.step()
    assert h.scheduler.stats().num_retracted == 1 and not h.outputs[2]
    h.run()
    scores = h.first[2].prompt
    assert scores is not None, "the retracted ChunkedReq lost its prompt logprobs"
    expected = [FakeModel.prompt_logprob(t, j) for j, t in enumerate(prompt) if j > 0]
    assert scores.token_ids.tolist() == prompt
    np.testing.assert_allclose(scores.logprobs, expected)
    assert scores.top_ids.tolist() == [t for t in prompt[1:] for _ in range(num_top)]
    assert h.outputs[2] == oracle(prompt, 1)
    h.assert_drained()


def test_the_victim_is_the_most_recently_admitted_never_the_oldest_and_a_readmission_keeps_its_place():
    h = make(num_pages=64, page_size=1)
    for i in range(3):
        h.submit(i, [10 * i + 1, 10 * i + 2], SamplingParams(max_tokens=20))
    h.step()
    decode = h.scheduler._decode
    assert [r.admit_seq for r in decode.reqs] == [0, 1, 2] and decode.retraction_victim().req_id == 2
    h.scheduler._retract(decode.retraction_victim())
    assert decode.retraction_victim().req_id == 1
    h.scheduler._retract(decode.retraction_victim())
    assert decode.retraction_victim() is None  # request 0 is the oldest: it always runs
    assert [p.req_id for p in h.scheduler._pending.ready] == [1, 2]  # retracted newest first, so the older waits in front
    h.step()  # both come back, in that order, keeping their places in the admission order
    assert [(r.req_id, r.admit_seq) for r in decode.reqs] == [(0, 0), (1, 1), (2, 2)]
    assert decode.retraction_victim().req_id == 2
    h.submit(3, [7, 7], SamplingParams(max_tokens=3))
    h.step()
    assert decode.retraction_victim().req_id == 3
    h.run()
    assert all(h.outputs[i] == oracle([10 * i + 1, 10 * i + 2], 20) for i in range(3))
    h.assert_drained()


def test_kv_reservation_counts_the_prompt_exactly_and_an_estimate_of_the_output():
    est = KvReservation("estimated", page_size=4)
    full = KvReservation("full", page_size=4)
    # a fresh request: 10 prompt tokens, max_tokens 21 -> 30 KV tokens, nothing cached
    kw = {"num_prompt_tokens": 10, "num_kv_tokens": 30, "cached_len": 0, "num_pages": 0}
    assert full.num_pages(**kw) == 8  # ceil(30 / 4)
    assert est.num_pages(**kw) == 6  # 10 + ceil(20 * 0.7) = 24 tokens
    assert est.num_pages(**{**kw, "cached_len": 8, "num_pages": 2}) == 4  # a prefix hit of 2 pages
    # running: 16 tokens in KV (4 pages), 14 output tokens left
    assert est.num_pages(num_prompt_tokens=10, num_kv_tokens=30, cached_len=16, num_pages=4) == 3  # 16 + ceil(9.8): 7 pages
    # a long output counts at most CLIP_TOKENS before the ratio
    big = {"num_prompt_tokens": 1, "num_kv_tokens": 1 + 10 * CLIP_TOKENS, "cached_len": 0, "num_pages": 0}
    assert est.num_pages(**big) == -(-(1 + int(np.ceil(CLIP_TOKENS * 0.7))) // 4)


def test_the_ratio_decays_each_decode_step_jumps_after_a_retraction_and_resets_when_idle():
    r = KvReservation("estimated", page_size=1)
    assert r.new_token_ratio == pytest.approx(0.7)
    for _ in range(300):
        r.on_decode_step()
    assert r.new_token_ratio == pytest.approx(0.4)
    for _ in range(1000):
        r.on_decode_step()
    assert r.new_token_ratio == pytest.approx(0.1)  # the floor
    r.on_retracted()
    assert r.new_token_ratio == pytest.approx(0.7)  # back to the start
    r.on_retracted()
    assert r.new_token_ratio == pytest.approx(0.85)  # still too low: halfway to 1
    r.on_decode_step()
    r.on_idle()
    assert r.new_token_ratio == pytest.approx(0.7)
    careful = KvReservation("estimated", page_size=1, conservativeness=2.0)
    assert (careful.init_ratio, careful.min_ratio) == (1.0, pytest.approx(0.2))
    with pytest.raises(AssertionError, match="full reservation"):
        KvReservation("full", page_size=1).on_retracted()
    with pytest.raises(ValueError, match="kv reservation"):
        KvReservation("lazy", page_size=1)
    with pytest.raises(ValueError, match="conservativeness"):
        KvReservation("estimated", page_size=1, conservativeness=0)
