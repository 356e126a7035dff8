"""Overlap scheduling on the scheduler's side (OverlapRows), against the FakeModel.

The harness sends step N+1 before it takes step N's result and computes a step only when its
result is taken (FutureTokens fills in the ids the step before sampled), so a page freed while a
step in flight still uses it is poisoned before that step reads it; it checks every token against
the true sequence, one final update per request, and the integrity after every call. On top,
here: who is fed a future token and who waits, what a request ending at step N costs (one row at
N+1, dropped), aborts and retractions under overlap, and outputs identical with overlap off.
"""

from __future__ import annotations

import pytest

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import future_token
from zserve.common.pooling import Pooling
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_choices import overlap_schedule_for
from zserve.common.scheduler_stats import SchedulerStats
from zserve.launcher.cli import parse_config
from zserve.scheduler_proc.scheduler import STEP_POLICIES
from zserve.scheduler_proc.stats_logger import StatsLogger

VOCAB = 64


def make(overlap=True, num_pages=64, page_size=1, **kw):
    kw.setdefault("max_prefill_tokens", 16)
    return SchedulerHarness(
        FakeModel(num_pages, page_size, VOCAB), context_len=128, eos_token_ids=[], overlap_schedule="on" if overlap else "off",
        **kw,
    )


def oracle(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(FakeModel.next_token(seq, VOCAB))
    return seq[len(prompt):]


def prompt_whose_token_is_new(at: int, start: int = 3) -> tuple[list[int], int]:
    """A prompt whose output token `at` differs from every token before it in the output: a stop token that ends
    the request exactly there."""
    for first in range(start, start + 200):
        prompt = [first, first + 1, first + 2]
        out = oracle(prompt, at + 1)
        if out[at] not in out[:at]:
            return prompt, out[at]
    raise AssertionError("no such prompt")


def test_decoding_rows_are_fed_the_tokens_of_the_step_in_flight():
    h = make(schedule_policy="prefill-first", admission_policy="fifo")
    h.submit(1, [3, 4, 5], SamplingParams(max_tokens=12, ignore_eos=True))
    h.submit(2, [6, 7, 8, 9], SamplingParams(max_tokens=12, ignore_eos=True))
    h.run()
    h.assert_drained()
    assert h.outputs[1] == oracle([3, 4, 5], 12) and h.outputs[2] == oracle([6, 7, 8, 9], 12)
    ahead = [b for b in h.batches if (b.input_ids < 0).any()]
    # after the prefill and one step on known tokens, every decode step is sent ahead of the one before
    assert len(ahead) >= 9 and all(b.input_ids.tolist() == [future_token(0), future_token(1)] for b in ahead)
    stats = h.scheduler.stats()
    assert stats.num_overlapped_steps == len(ahead) and stats.num_decoded_tokens == 2 * 11


def test_a_request_that_stops_at_step_n_gets_nothing_from_step_n_plus_1_and_keeps_its_kv():
    """Its stop token is sampled at step N while step N+1, already sent, computes on it: the client gets that token
    with finish reason stop and nothing after; its pages are freed once, after step N+1, with the K/V step N+1 wrote
    for the stop token kept in the radix cache under its real id (a later prompt through it hits it, and the fake
    model reads the token ids back: a wrong id there would give it a wrong token)."""
    prompt, stop = prompt_whose_token_is_new(at=3)
    for overlap in (False, True):
        h = make(overlap)
        h.submit(1, prompt, SamplingParams(max_tokens=20, stop_token_ids=(stop,)))
        h.run()
        assert h.outputs[1] == oracle(prompt, 4) and h.final[1].finish_reason == FinishReason.STOP
        # one decode row per output token after the first; under overlap one more, fed the stop token and dropped
        assert h.scheduler.stats().num_decoded_tokens == 3 + overlap
        h.assert_drained()
        later = prompt + h.outputs[1] + [5]
        h.submit(2, later, SamplingParams(max_tokens=3))
        h.run()
        h.assert_drained()
        # the stop token's K/V exists only where a step was fed it
        assert h.first[2].num_cached_tokens == len(prompt) + 3 + overlap


def test_a_request_ending_by_length_at_step_n_is_not_fed_to_step_n_plus_1():
    for overlap in (False, True):
        h = make(overlap)
        h.submit(1, [3, 4, 5], SamplingParams(max_tokens=5, ignore_eos=True))
        h.run()
        h.assert_drained()
        assert h.outputs[1] == oracle([3, 4, 5], 5) and h.final[1].finish_reason == FinishReason.LENGTH
        assert h.scheduler.stats().num_decoded_tokens == 4


def test_an_abort_while_two_steps_hold_the_request_frees_it_once_after_both():
    prompt = [3, 4, 5]
    h = make()
    h.submit(1, prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    h.submit(2, [9, 10, 11], SamplingParams(max_tokens=30, ignore_eos=True))
    while len(h.outputs[1]) < 5:
        h.step()
    assert h.scheduler.num_in_flight == 1
    sent = len(h.outputs[1])
    # the next step is sent (request 1 fed the token of the step in flight), then the abort comes, then that step's
    # result: its token for request 1 is dropped, the step after still holds the request's pages
    h.step(abort_in_flight=[1])
    assert h.final[1].finish_reason == FinishReason.ABORT and len(h.outputs[1]) == sent
    assert h.scheduler.num_in_flight == 1 and h.scheduler.stats().num_used_pages > len(h.prompts[2])
    h.run()
    h.assert_drained()
    assert h.outputs[2] == oracle([9, 10, 11], 30)
    # the token request 1 never got (step N's) was fed to step N+1, whose K/V is cached under that token's real id
    never_sent = oracle(prompt, sent + 1)
    h.submit(3, prompt + never_sent + [7], SamplingParams(max_tokens=2))
    h.run()
    h.assert_drained()
    assert h.first[3].num_cached_tokens == len(prompt) + sent + 1


def test_rows_under_penalties_wait_for_the_result_while_plain_rows_are_fed():
    h = make(schedule_policy="prefill-first", admission_policy="fifo")
    h.submit(1, [3, 4, 5], SamplingParams(max_tokens=10, ignore_eos=True))
    h.submit(2, [6, 7, 8], SamplingParams(max_tokens=10, ignore_eos=True, frequency_penalty=0.5))
    h.run()
    h.assert_drained()
    assert h.outputs[1] == oracle([3, 4, 5], 10) and h.outputs[2] == oracle([6, 7, 8], 10)
    penalized = [b for b in h.batches if b.penalties is not None and b.is_decode_only]
    assert len(penalized) == 9  # every token after its first, each from a decode step of its own
    for b in penalized:  # row i's input id is input_ids[i]
        assert (b.input_ids[b.penalties.rows] >= 0).all(), "a penalized row was fed a future token"
    assert any((b.input_ids < 0).any() for b in h.batches)


def test_a_decode_step_short_of_pages_waits_for_the_result_then_retracts():
    """Requests arriving step by step into a pool too small for all of them to run to the context: the step that
    finds no page waits for the one in flight (a retraction folds that step's token into the prompt) and retracts
    then; every token is still the true one."""
    h = SchedulerHarness(FakeModel(56, 4, VOCAB), context_len=128, eos_token_ids=[0], max_prefill_tokens=64,
                         overlap_schedule="on")
    for i in range(8):
        h.submit(i, [5 + i, 6, 7, 8, 9, 10, 11, 12], SamplingParams(ignore_eos=True))
        h.step()
    h.run()
    h.assert_drained()
    stats = h.scheduler.stats()
    assert stats.num_retracted > 0 and stats.num_overlapped_steps > 0.9 * stats.num_steps, stats


@pytest.mark.parametrize("policy", STEP_POLICIES)
def test_outputs_are_identical_with_overlap_on_and_off(policy):
    """Mixed traffic: chunked prompts, a shared prefix (radix hits), n copies, stop tokens, penalties, greedy and
    seeded sampling: every request's tokens are the same with and without overlap scheduling."""
    def run(overlap):
        h = make(overlap, num_pages=96, page_size=2, schedule_policy=policy, max_prefill_tokens=8)
        shared = list(range(10, 30))
        h.submit(0, shared + [1, 2], SamplingParams(max_tokens=14, ignore_eos=True))
        h.submit(1, [3, 4], SamplingParams(max_tokens=9, temperature=0.8, seed=5), num_copies=3)
        for i in range(4, 10):
            h.step()
            h.submit(i, shared + [i], SamplingParams(max_tokens=6 + i, stop_token_ids=(7,), repetition_penalty=1.0
                                                      + 0.1 * (i % 2), ignore_eos=True))
        h.run()
        h.assert_drained()
        return h.outputs, h.scheduler.stats()

    off, off_stats = run(False)
    on, on_stats = run(True)
    assert on == off
    assert on_stats.num_overlapped_steps > 0 and off_stats.num_overlapped_steps == 0
    assert on_stats.num_prefix_hit_tokens > 0


def test_the_flags_and_what_auto_means_on_each_device():
    assert parse_config([]).overlap_schedule == "auto"
    assert parse_config(["--enable-overlap-schedule"]).overlap_schedule == "on"
    assert parse_config(["--disable-overlap-schedule"]).overlap_schedule == "off"
    assert parse_config(["--overlap-schedule", "on"]).overlap_schedule == "on"
    with pytest.raises(SystemExit):
        parse_config(["--overlap-schedule", "sometimes"])
    assert overlap_schedule_for("auto", "cuda") == "on" and overlap_schedule_for("auto", "cpu") == "off"
    assert overlap_schedule_for("on", "cpu") == "on" and overlap_schedule_for("off", "cuda") == "off"
    with pytest.raises(ValueError, match="overlap schedule must be one of"):
        overlap_schedule_for("maybe", "cpu")
    # an embedding server never overlaps (it only prefills)
    assert not make(True, pooling=Pooling("mean", normalize=True)).scheduler.overlaps


def test_the_stats_line_reports_the_share_of_steps_sent_ahead():
    log = StatsLogger(interval_s=10.0, num_pages=100)
    log.restart(0.0, SchedulerStats(num_steps=10, num_overlapped_steps=4))
    assert "sent ahead" not in log.format_line(SchedulerStats(num_steps=20), 10.0)  # overlap off: never any
    assert "; 75% of steps sent ahead" in log.format_line(SchedulerStats(num_steps=30, num_overlapped_steps=19), 10.0)
