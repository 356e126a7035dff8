"""--max-step-ms: the prefill chunk beside running decodes sized from the measured cost per token
(scheduler_proc/step_time_bound.py), alone and driving a Scheduler whose fake worker reports step times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.forward_batch import ForwardBatch
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.step_time_bound import AUTO_DECODE_MULTIPLE, MIN_CHUNK_TOKENS, StepTimeBound

VOCAB, EOS = 97, 0


def test_the_whole_budget_while_nothing_decodes_or_nothing_is_measured():
    bound = StepTimeBound(0.0, 512)
    assert bound.prefill_budget(num_running=4, decodes_ride_along=True) == 512  # nothing measured yet
    bound.observe(num_prefill_tokens=0, num_decode_rows=4, forward_ms=100.0)
    assert bound.prefill_budget(num_running=4, decodes_ride_along=True) == 512  # no prefill cost yet
    bound.observe(num_prefill_tokens=512, num_decode_rows=0, forward_ms=1024.0)  # 2 ms a token
    assert bound.prefill_budget(num_running=0, decodes_ride_along=False) == 512  # nobody waits
    assert bound.last_budget_tokens == 0


def test_auto_keeps_a_step_within_three_decode_steps():
    bound = StepTimeBound(0.0, 512)
    bound.observe(0, 8, 100.0)
    bound.observe(512, 0, 1024.0)
    assert AUTO_DECODE_MULTIPLE == 3.0
    assert bound.prefill_budget(8, decodes_ride_along=True) == 100  # (300 - 100) ms / 2 ms
    assert bound.last_budget_tokens == 100
    assert bound.prefill_budget(8, decodes_ride_along=False) == 150  # the decodes wait for the step: 300 ms / 2 ms


def test_a_fixed_bound_a_floor_and_a_ceiling():
    bound = StepTimeBound(500.0, 512)
    bound.observe(0, 8, 100.0)
    bound.observe(512, 0, 1024.0)
    assert bound.prefill_budget(8, True) == 200  # (500 - 100) / 2
    tight = StepTimeBound(50.0, 512)
    tight.observe(0, 8, 100.0)
    tight.observe(512, 0, 1024.0)
    assert tight.prefill_budget(8, True) == MIN_CHUNK_TOKENS  # the prompt always moves on
    loose = StepTimeBound(1e6, 512)
    loose.observe(0, 8, 100.0)
    loose.observe(512, 0, 1024.0)
    assert loose.prefill_budget(8, True) == 512


def test_a_mixed_steps_cost_per_token_leaves_out_its_decode_rows():
    bound = StepTimeBound(0.0, 512)
    bound.observe(0, 8, 100.0)
    bound.observe(200, 8, 500.0)  # 100 ms of decode rows + 200 tokens at 2 ms
    assert bound.prefill_ms_per_token == pytest.approx(2.0)


def test_a_negative_bound_turns_it_off_and_nan_is_refused():
    for no_bound in (-1.0, math.inf):
        off = StepTimeBound(no_bound, 512)
        off.observe(0, 8, 100.0)
        off.observe(512, 0, 1024.0)
        assert not off.enabled and off.prefill_budget(8, True) == 512
    with pytest.raises(ValueError, match="max_step_ms"):
        StepTimeBound(math.nan, 512)


BASE_MS, PER_TOKEN_MS = 20.0, 0.25  # the fake worker: a step costs a base and each token it computes


def fake_step_ms(batch: ForwardBatch) -> float:
    return BASE_MS + PER_TOKEN_MS * float(np.asarray(batch.extend_lens).sum())


def run_long_prompt_beside_decodes(max_step_ms: float) -> tuple[SchedulerHarness, list[float]]:
    """4 requests decoding, then a 900-token prompt: the step times of every step with decode rows and a chunk."""
    h = SchedulerHarness(
        FakeModel(512, 4, VOCAB), context_len=1200, eos_token_ids=[EOS], step_ms=fake_step_ms,
        max_prefill_tokens=256, max_step_ms=max_step_ms, schedule_policy="mixed",
    )
    rng = np.random.default_rng(0)
    for req_id in range(4):
        h.submit(req_id, rng.integers(1, VOCAB, 8).tolist(), SamplingParams(max_tokens=120, ignore_eos=True))
    for _ in range(6):  # prefilled, then a few decode-only steps
        h.step()
    h.submit(9, rng.integers(1, VOCAB, 900).tolist(), SamplingParams(max_tokens=2, ignore_eos=True))
    first = len(h.batches)
    h.run()
    mixed_ms = [fake_step_ms(b) for b in h.batches[first:] if (np.asarray(b.extend_lens) > 1).any()
                and (np.asarray(b.extend_lens) == 1).any()]
    h.assert_drained()
    return h, mixed_ms


def test_a_long_prompt_beside_decodes_keeps_their_steps_near_the_target():
    decode_ms = BASE_MS + 4 * PER_TOKEN_MS  # 21 ms
    bounded, bounded_ms = run_long_prompt_beside_decodes(0.0)
    assert len(bounded_ms) >= 5
    assert max(bounded_ms[1:]) <= AUTO_DECODE_MULTIPLE * decode_ms + PER_TOKEN_MS  # after the step that measured the cost
    expected_chunk = int((AUTO_DECODE_MULTIPLE - 1) * decode_ms / PER_TOKEN_MS)  # 168 tokens
    # the estimate starts from the short prompts' step (fixed costs included) and converges on 0.25 ms a token
    assert 0.85 * expected_chunk <= bounded.scheduler.stats().prefill_chunk_tokens <= expected_chunk

    unbounded, unbounded_ms = run_long_prompt_beside_decodes(-1.0)
    assert max(unbounded_ms) > AUTO_DECODE_MULTIPLE * decode_ms  # the token budget alone: 252-token chunks
    assert unbounded.scheduler.stats().prefill_chunk_tokens == 0
    assert unbounded.outputs == bounded.outputs  # the bound changes when tokens are computed, not which


def test_the_stats_line_reports_the_chunk_once_one_was_bounded():
    from zserve.common.scheduler_stats import SchedulerStats
    from zserve.scheduler_proc.stats_logger import StatsLogger

    log = StatsLogger(interval_s=10.0, num_pages=100)
    log.restart(0.0, SchedulerStats())
    assert "prefill chunk" not in log.format_line(SchedulerStats(), 10.0)
    assert "prefill chunk beside decodes 168 tokens" in log.format_line(SchedulerStats(prefill_chunk_tokens=168), 10.0)
