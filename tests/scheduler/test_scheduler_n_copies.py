"""n choices of one prompt fan out in the scheduler core: copies req_id .. req_id + n - 1, queued
together, the prompt computed once (the copies take the first one's K/V), copy i seeded seed + i."""

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.sampling_params import SamplingParams

VOCAB = 64
PROMPT = list(range(3, 14))  # 11 tokens


def make(**knobs) -> SchedulerHarness:
    return SchedulerHarness(FakeModel(64, 4, VOCAB), context_len=128, eos_token_ids=[1000], **knobs)


def test_n_copies_share_one_prefill_draw_from_seed_plus_i_and_free_every_page():
    h = make(enable_radix_cache=False)  # so every page is free at the end, not cached
    assert h.submit(20, PROMPT, SamplingParams(max_tokens=5, temperature=1.0, seed=7), num_copies=4) == []
    first = h.step()
    assert [u.req_id for u in first] == [20, 21, 22, 23]  # every copy samples its first token from the one prefill
    batch = h.batches[0]
    assert batch.sampling.seed.tolist() == [7, 8, 9, 10]
    assert batch.is_computed.tolist() == [True, False, False, False]  # the copies take the first one's K/V
    h.run()
    h.assert_drained()
    assert all(len(h.outputs[i]) == 5 and h.final[i].finish_reason is FinishReason.LENGTH for i in range(20, 24))
    stats = h.scheduler.stats()
    assert stats.num_prefilled_tokens == len(PROMPT) and stats.num_submitted == stats.num_finished == 4
    assert stats.num_free_pages == h.model.num_pages


def test_seeds_wrap_below_2_to_the_63_and_copies_without_a_seed_draw_their_own():
    h = make()
    h.submit(0, PROMPT, SamplingParams(max_tokens=1, temperature=1.0, seed=2**63 - 2), num_copies=3)
    h.submit(3, PROMPT, SamplingParams(max_tokens=1, temperature=1.0), num_copies=3)
    h.step()
    seeds = h.batches[0].sampling.seed.tolist()
    assert seeds[:3] == [2**63 - 2, 2**63 - 1, 0]
    assert len(set(seeds[3:])) == 3
    h.run()
    h.assert_drained()


def test_each_copy_is_refused_on_its_own_when_the_queue_fills():
    h = make(max_queued_requests=2)
    refused = h.submit(5, PROMPT, SamplingParams(max_tokens=2), num_copies=3)
    assert [(u.req_id, u.code) for u in refused] == [(7, ErrorCode.BUSY)]
    h.run()
    h.assert_drained()
    assert sorted(h.final) == [5, 6, 7] and len(h.outputs[5]) == len(h.outputs[6]) == 2


def test_an_abort_ends_one_copy_and_the_others_go_on():
    h = make()
    h.submit(0, PROMPT, SamplingParams(max_tokens=4), num_copies=3)
    h.step()
    h.abort(1)
    h.run()
    h.assert_drained()
    assert h.final[1].finish_reason is FinishReason.ABORT
    assert len(h.outputs[0]) == len(h.outputs[2]) == 4
