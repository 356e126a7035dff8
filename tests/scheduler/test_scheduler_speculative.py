"""Speculative decoding (n-gram drafts) on the scheduler's side, against the FakeModel.

The FakeModel verifies drafts as the worker does (accept while equal to its true next token) and
poisons the slots of rejected positions; the harness checks every token against the true
sequence, the updates' rules and the integrity after every call. On top, here: with speculation
the outputs are token-identical to without, on mixed traffic (chunked prompts, max_tokens and stop
tokens inside drafts, retraction, n copies, rows that may not be drafted, radix-cache reuse of
finished requests' K/V); drafting backs off on an unpredictable stream; the per-step cap holds;
the stats count exactly; the drafter finds what it should; the config parses and refuses.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import StatsOut
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_stats import SchedulerStats
from zserve.common.server_config import ServerConfig
from zserve.common.speculative_settings import SpeculativeSettings, resolve_speculative_config
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.launcher.cli import parse_config
from zserve.scheduler_proc.ngram_drafter import BACKOFF_MIN_STEPS, BACKOFF_WINDOW, MISS_STEPS, NgramDrafter
from zserve.scheduler_proc.scheduler import STEP_POLICIES
from zserve.scheduler_proc.scheduler_knobs import scheduler_knobs
from zserve.scheduler_proc.stats_logger import StatsLogger

VOCAB = 48
EOS = (0, 1)


class RecordingModel(FakeModel):
    """A FakeModel that keeps every (batch, result) pair, for exact counts."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.steps = []

    def forward(self, batch):
        result = super().forward(batch)
        self.steps.append((batch, result))
        return result


class NoisyModel(RecordingModel):
    """True next token: a strong hash of the whole sequence, which no n-gram predicts."""

    def true_next_token(self, seq) -> int:
        digest = hashlib.blake2b(np.asarray(seq, np.int64).tobytes(), digest_size=8).digest()
        return 2 + int.from_bytes(digest, "little") % (self.vocab_size - 2)  # never an EOS id


def harness(spec: bool, *, num_pages=120, page_size=4, echo_period=5, echo_break=16, model_cls=RecordingModel, **knobs) -> SchedulerHarness:
    model = model_cls(num_pages, page_size, VOCAB, echo_period=echo_period, echo_break=echo_break)
    knobs = {"context_len": 96, "eos_token_ids": EOS, "seed": 1, "speculative_num_draft_tokens": 4, **knobs}
    return SchedulerHarness(model, speculative_algorithm="ngram" if spec else "none", **knobs)


def workload(seed: int) -> list[tuple[int, list[int], SamplingParams, int, int]]:
    """(req_id, prompt, params, n copies, submit before step): repetitive prompts of many lengths,
    max_tokens small and large, stop tokens, sampled rows, n copies, and rows that may not be drafted."""
    rng = random.Random(seed)
    out, req_id = [], 0
    for i in range(14):
        period = rng.randint(2, 6)
        unit = [rng.randint(2, VOCAB - 1) for _ in range(period)]
        prompt = (unit * 10)[: rng.randint(1, 40)] + [rng.randint(2, VOCAB - 1) for _ in range(rng.randint(0, 3))]
        kind = i % 7
        params = SamplingParams(
            max_tokens=rng.choice([None, 1, 2, 3, 7, 30, 60]),
            ignore_eos=rng.random() < 0.7,
            stop_token_ids=(rng.choice(prompt),) if kind == 1 else (),
            temperature=0.7 if kind == 2 else 0.0,
            seed=i,
            return_logprob=kind == 3,
            top_logprobs=2 if kind == 4 else 0,
            presence_penalty=0.5 if kind == 5 else 0.0,
        )
        copies = 3 if kind == 6 else 1
        out.append((req_id, prompt, params, copies, rng.randint(0, 12)))
        req_id += copies
    return out


def play(h: SchedulerHarness, load) -> SchedulerHarness:
    for step in range(200):
        for req_id, prompt, params, copies, at in load:
            if at == step:
                h.submit(req_id, prompt, params, copies)
        if step > max(at for *_, at in load) and not h.scheduler.has_work:
            break
        h.step()
    h.run()
    h.assert_drained()
    return h


def drafted_rows(h: SchedulerHarness):
    """(batch, row, drafts, accepted) of every drafted row of the run."""
    for batch, result in h.model.steps:
        if batch.draft_lens is None:
            continue
        for row in np.flatnonzero(batch.draft_lens).tolist():
            yield batch, row, int(batch.draft_lens[row]), int(result.num_accepted[row])


@pytest.mark.parametrize("policy", STEP_POLICIES)
@pytest.mark.parametrize("reservation", ["estimated", "full"])
@pytest.mark.parametrize("radix", [True, False])
def test_outputs_are_token_identical_with_and_without_speculation(policy, reservation, radix):
    knobs = {"schedule_policy": policy, "kv_reservation": reservation, "enable_radix_cache": radix, "max_prefill_tokens": 16,
             "max_running_requests": 8, "num_pages": 80}
    for seed in range(3):
        load = workload(seed)
        plain, spec = play(harness(False, **knobs), load), play(harness(True, **knobs), load)
        assert spec.outputs == plain.outputs
        assert {i: u.finish_reason for i, u in spec.final.items()} == {i: u.finish_reason for i, u in plain.final.items()}
        stats = spec.scheduler.stats()
        assert stats.num_accepted_tokens > 0.5 * stats.num_draft_tokens > 0, stats
        assert stats.num_decoded_tokens < plain.scheduler.stats().num_decoded_tokens  # fewer decode rows for the same tokens
        # who may not be drafted never was (ForwardBatch.validate in the model checks the same)
        barred = {i for i, _, p, n, _ in load for i in range(i, i + n) if p.return_logprob or p.top_logprobs or p.presence_penalty}
        for batch, row, _, _ in drafted_rows(spec):
            assert batch.cached_lens[row] > 0 and batch.is_sampled[row]
        assert barred and all(i in spec.outputs for i in barred)


def test_later_requests_reuse_the_kv_finished_ones_left_in_the_radix_cache():
    """Round 2 continues round 1's sequences: a prefix hit on K/V written by drafted steps, so a
    rejected draft's slot left in the cache would give a wrong token (or a poisoned read)."""
    results = {}
    for spec in (False, True):
        h = harness(spec, num_pages=200, enable_radix_cache=True, max_prefill_tokens=32)
        first = [(i, p, SamplingParams(max_tokens=25, ignore_eos=True), 1, 0) for i, p, *_ in workload(7)[:6] if len(p) > 4]
        play(h, first)
        hits_before = h.scheduler.stats().num_prefix_hit_tokens
        second = [(100 + i, p + h.outputs[i], SamplingParams(max_tokens=12, ignore_eos=True), 1, 0) for i, p, *_ in first]
        play(h, [(i, p, s, n, h.scheduler.stats().num_steps) for i, p, s, n, _ in second])
        assert h.scheduler.stats().num_prefix_hit_tokens - hits_before >= sum(len(p) // 8 * 4 for _, p, *_ in second)
        results[spec] = h.outputs
    assert results[True] == results[False]


def test_retraction_under_kv_pressure_keeps_outputs_identical():
    num_retracted = 0
    for num_pages, page_size, context_len in [(32, 4, 42), (24, 4, 32)]:
        # a stream that breaks its period often and 2 drafts a step: requests run long enough to outgrow their estimates
        knobs = {"num_pages": num_pages, "page_size": page_size, "context_len": context_len, "kv_reservation": "estimated",
                 "max_running_requests": 8, "max_prefill_tokens": 24, "echo_period": 3, "echo_break": 3,
                 "speculative_num_draft_tokens": 2}
        for seed in range(4):
            rng = random.Random(seed)
            load = []
            for i in range(10):
                unit = [rng.randint(2, VOCAB - 1) for _ in range(3)]
                load.append((i, (unit * 3)[: rng.randint(2, 6)], SamplingParams(ignore_eos=True), 1, rng.randint(0, 3)))
            plain, spec = play(harness(False, **knobs), load), play(harness(True, **knobs), load)
            assert spec.outputs == plain.outputs
            assert spec.scheduler.stats().num_draft_tokens > 0
            num_retracted += spec.scheduler.stats().num_retracted
    assert num_retracted > 0


def test_stop_tokens_and_max_tokens_inside_accepted_drafts_end_there():
    """A stop token or the max_tokens-th token among a step's accepted drafts is the update's last
    token; the drafts after it are dropped (the harness checks every token and the finish)."""
    seen = {FinishReason.STOP: 0, FinishReason.LENGTH: 0}
    for seed in range(10):
        rng = random.Random(seed)
        unit = [rng.randint(2, VOCAB - 1) for _ in range(5)]
        stop = unit[rng.randint(0, 4)]
        h = harness(True, echo_period=5)
        h.submit(0, unit * 2, SamplingParams(ignore_eos=True, stop_token_ids=(stop,), max_tokens=80))
        h.submit(1, unit * 2, SamplingParams(ignore_eos=True, max_tokens=rng.randint(4, 30)))
        h.run()
        h.assert_drained()
        for u in h.final.values():
            if len(u.token_ids) > 1:
                seen[u.finish_reason] += 1
        assert stop not in h.outputs[0][:-1]
    assert seen[FinishReason.STOP] > 0 and seen[FinishReason.LENGTH] > 0, seen


def test_stats_count_every_draft_and_every_accepted_token_exactly():
    h = play(harness(True), workload(3))
    rows = list(drafted_rows(h))
    stats = h.scheduler.stats()
    assert stats.num_drafts == len(rows)
    assert stats.num_draft_tokens == sum(d for _, _, d, _ in rows)
    assert stats.num_accepted_tokens == sum(a for *_, a in rows)
    assert stats.num_generated_tokens == sum(len(o) for o in h.outputs.values())
    assert stats.mean_acceptance_length == pytest.approx(1 + stats.num_accepted_tokens / stats.num_drafts)
    assert stats.num_decoded_tokens == sum(int((b.cached_lens[: _num_decode(b)] > 0).sum()) for b, _ in h.model.steps)


def _num_decode(batch) -> int:
    """Decode rows come first: sampled rows with cached K/V and one token, or drafts."""
    n = 0
    while n < batch.num_reqs and batch.cached_lens[n] > 0 and (batch.extend_lens[n] == 1 or (batch.draft_lens is not None and
                                                                                           batch.draft_lens[n] == batch.extend_lens[n] - 1)):
        n += 1
    return n


def test_verify_tokens_stay_within_half_the_budget_and_what_prefill_left():
    h = harness(True, max_prefill_tokens=20, max_running_requests=16, num_pages=400, context_len=128)
    scheduler, num_decode = h.scheduler, {}
    schedule_decode = scheduler._schedule_decode

    def recorded():  # decode rows per step (the step's id is the step count when its decode part is built)
        reqs = schedule_decode()
        num_decode[scheduler.stats().num_steps] = len(reqs)
        return reqs

    scheduler._schedule_decode = recorded
    for i in range(16):
        h.submit(i, [2 + i, 3 + i, 4 + i] * 4, SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(12):  # some run, then a long prompt arrives: it is chunked, and prefilled before anyone drafts
        h.step()
    h.submit(99, list(range(2, 47)), SamplingParams(max_tokens=4, ignore_eos=True))
    h.run()
    h.assert_drained()
    capped = num_prefill_steps = 0
    for batch, _ in h.model.steps:
        rows = num_decode[batch.step_id]
        num_prefill_tokens = int(batch.extend_lens[rows:].sum())
        num_drafts = int(batch.draft_lens.sum()) if batch.draft_lens is not None else 0
        # the verify cap, and only what the prefill part left of the budget of 20
        assert num_drafts <= max(0, min(10, 20 - num_prefill_tokens) - rows), (batch.step_id, rows, num_prefill_tokens, num_drafts)
        assert batch.draft_lens is None or not batch.draft_lens[rows:].any()
        capped += num_drafts == 10 - rows
        if rows and not batch.is_sampled.all():  # a chunk of the waiting prompt next to decode rows: it took the rest, no drafts
            assert num_prefill_tokens == 20 - rows and num_drafts == 0, (batch.step_id, rows, num_prefill_tokens, num_drafts)
            num_prefill_steps += 1
    assert capped > 0 and num_prefill_steps > 0


def test_no_drafts_in_steps_with_disable_by_batch_size_decoding_requests():
    h = harness(True, max_running_requests=16, num_pages=400, context_len=128, speculative_disable_by_batch_size=4)
    for i in range(6):  # 6 run at once, then finish one after another (max_tokens 8, 14, ..., 38)
        h.submit(i, [2 + i, 3 + i, 4 + i] * 4, SamplingParams(max_tokens=8 + 6 * i, ignore_eos=True))
    h.run()
    h.assert_drained()
    drafted_rows = set()
    for batch, _ in h.model.steps:
        if batch.draft_lens is not None and batch.draft_lens.any():
            num_decode = batch.num_reqs  # all were admitted in the first step: every later step is decode rows only
            assert (batch.cached_lens > 0).all() and (batch.extend_lens == 1 + batch.draft_lens).all()
            assert num_decode < 4, (batch.step_id, num_decode)
            drafted_rows.add(num_decode)
    assert drafted_rows and max(drafted_rows) == 3  # below the bar, drafts come back


def test_drafting_backs_off_on_an_unpredictable_stream():
    h = harness(True, model_cls=NoisyModel, num_pages=800, context_len=400, max_running_requests=8)
    for i in range(8):
        h.submit(i, [random.Random(i).randint(2, VOCAB - 1) for _ in range(10)], SamplingParams(max_tokens=300, ignore_eos=True))
    h.run()
    h.assert_drained()
    stats = h.scheduler.stats()
    decode_rows = stats.num_decoded_tokens
    assert stats.num_accepted_tokens < 0.1 * stats.num_draft_tokens
    assert stats.num_drafts < 0.15 * decode_rows, (stats.num_drafts, decode_rows)
    # the late part of each stream is drafted far less than the start
    late = sum(1 for b, row, _, _ in drafted_rows(h) if b.cached_lens[row] > 210)
    early = sum(1 for b, row, _, _ in drafted_rows(h) if b.cached_lens[row] <= 100)
    assert late < early / 2, (early, late)


# -- the drafter alone ----------------------------------------------------------------------


@dataclass
class FakeReq:
    req_id: int
    input_ids: np.ndarray
    output_ids: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)

    @property
    def num_orig_prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)


def req(tokens, output=(), **params) -> FakeReq:
    return FakeReq(0, np.asarray(tokens, np.int32), list(output), SamplingParams(**params))


def reference(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The brute-force rule: longest window first, most recent earlier occurrence, what followed it
    (copied on into the drafts themselves where it runs into the end: a periodic continuation)."""
    length = len(tokens)
    for n in range(min(hi, length - 1), lo - 1, -1):
        for j in range(length - n - 1, -1, -1):
            if tokens[j : j + n] == tokens[length - n :]:
                extended = list(tokens)
                for i in range(k):
                    extended.append(extended[j + n + i])
                return extended[length:]
    return []


def test_drafter_prefers_the_longest_window_and_the_most_recent_occurrence():
    d = NgramDrafter(num_draft_tokens=3, min_window=1, max_window=3)
    # "5 6 7" occurs at 0 and 6 (most recent: 6, followed by 9 1); "7" alone last occurs at 10
    seq = [5, 6, 7, 8, 4, 2, 5, 6, 7, 9, 7, 1, 5, 6, 7]
    assert d.propose(req(seq), 10) == [9, 7, 1]
    d = NgramDrafter(num_draft_tokens=3, min_window=1, max_window=1)  # the last "7" alone: at 10, followed by 1 5 6
    assert d.propose(req(seq), 10) == [1, 5, 6]


def test_drafter_caps_at_k_and_at_max_drafts_and_finds_nothing_without_a_match():
    d = NgramDrafter(num_draft_tokens=2, min_window=1, max_window=2)
    assert d.propose(req([1, 2, 3, 4, 1, 2]), 10) == [3, 4]
    d.release(0)
    assert d.propose(req([1, 2, 3, 4, 1, 2]), 1) == [3]
    d.release(0)
    assert d.propose(req([1, 2, 3, 4, 5]), 10) == []
    d.release(0)
    assert d.propose(req([7]), 10) == []
    d.release(0)
    assert d.propose(req([5, 5, 5]), 10) == [5, 5]  # the match runs into the end: periodic
    d = NgramDrafter(num_draft_tokens=4, min_window=2, max_window=3)  # a single repeated token is not enough
    assert d.propose(req([1, 9, 2, 8, 3, 9]), 10) == []


def test_drafter_skips_token_ids_its_keys_cannot_pack():
    d = NgramDrafter(4, 1, 3)
    assert d.propose(req([1, 2, 1 << 21, 1, 2]), 10) == []


def test_drafter_skips_requests_the_worker_cannot_verify():
    d = NgramDrafter(4, 1, 3)
    for params in ({"return_logprob": True}, {"top_logprobs": 1}, {"repetition_penalty": 1.2}, {"logit_bias": {"3": 1.0}},
                   {"min_tokens": 2}, {"regex": "a+"}):
        assert d.propose(req([1, 2, 1, 2, 1], **params), 10) == [], params
        d.release(0)
    assert d.propose(req([1, 2, 1, 2, 1], temperature=0.8), 10) == [2, 1, 2, 1]  # "1 2 1" at 0: 2 1, then periodic


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    steps=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), max_size=12),
    lo=st.integers(1, 3), extra=st.integers(0, 3), k=st.integers(1, 5),
)
def test_drafter_index_updated_step_by_step_matches_the_brute_force_rule(prompt, steps, lo, extra, k):
    d = NgramDrafter(k, lo, lo + extra, miss_steps=0)
    r = req(prompt)
    assert d.propose(r, 100) == reference(prompt, k, lo, lo + extra)
    for new in steps:
        r.output_ids.extend(new)
        assert d.propose(r, 100) == reference(prompt + r.output_ids, k, lo, lo + extra)


def test_a_request_with_nothing_to_copy_from_skips_lookups_for_a_while_and_catches_up():
    d = NgramDrafter(2, 1, 1)
    r = req(list(range(10, 20)))
    for i in range(MISS_STEPS):
        assert d.propose(r, 10) == [], i
        r.output_ids.append(100 + i)
    r.output_ids += [7, 8, 9, 7]  # "7" repeats: found again once the pause is over
    assert [d.propose(r, 10) for _ in range(MISS_STEPS)] == [[]] * MISS_STEPS
    assert d.propose(r, 10) == [8, 9]


def test_backoff_pauses_a_rejected_request_longer_each_time_and_resets_on_success():
    d = NgramDrafter(4, 1, 1)
    r = req([3, 3, 3, 3])
    pauses = []
    for _ in range(3):
        for _ in range(BACKOFF_WINDOW):
            assert d.propose(r, 10)
            d.on_verified(0, 4, 0)
        skipped = 0
        while not d.propose(r, 10):
            skipped += 1
        pauses.append(skipped)
    assert pauses == [BACKOFF_MIN_STEPS, 2 * BACKOFF_MIN_STEPS, 4 * BACKOFF_MIN_STEPS]
    for _ in range(BACKOFF_WINDOW):
        d.on_verified(0, 4, 3)
    assert d._states[0].backoff_steps == BACKOFF_MIN_STEPS and not d.is_backing_off(0)


# -- config, stats line, metrics --------------------------------------------------------------


def test_flags_and_the_vllm_json_give_the_same_config():
    flags = parse_config(["--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "6",
                          "--speculative-ngram-min-match-window-size", "2", "--speculative-ngram-max-match-window-size", "4",
                          "--speculative-disable-by-batch-size", "8"])
    spec = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "disable_by_batch_size": 8}
    from_json = parse_config(["--speculative-config", json.dumps(spec)])
    assert resolve_speculative_config(flags) == resolve_speculative_config(from_json) == flags
    assert parse_config(["--speculative-algorithm", "NGRAM"]).speculative_algorithm == "ngram"
    assert parse_config(["--ngram-prompt-lookup-max", "5"]).speculative_ngram_max_match_window_size == 5
    knobs = scheduler_knobs(from_json)
    assert (knobs["speculative_algorithm"], knobs["speculative_num_draft_tokens"], knobs["speculative_ngram_min_window"],
            knobs["speculative_ngram_max_window"], knobs["speculative_disable_by_batch_size"]) == ("ngram", 6, 2, 4, 8)
    assert scheduler_knobs(ServerConfig())["speculative_algorithm"] == "none"
    only_max = SpeculativeSettings.of(ServerConfig(speculative_config='{"method": "NGRAM", "prompt_lookup_max": 2}'))
    assert (only_max.min_window, only_max.max_window, only_max.num_draft_tokens) == (1, 2, ServerConfig().speculative_num_draft_tokens)


@pytest.mark.parametrize(("config", "message"), [
    ({"speculative_config": "{not json"}, "not valid JSON"),
    ({"speculative_config": '["ngram"]'}, "JSON object"),
    ({"speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}'}, "method must be"),
    ({"speculative_config": '{"method": "ngram", "model": "x"}'}, "unsupported key"),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 0}'}, "integer >= 1"),
    ({"speculative_config": '{"method": "ngram", "disable_by_batch_size": -1}'}, "integer >= 0"),
    ({"speculative_config": '{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}'}, "at most"),
    ({"speculative_ngram_min_match_window_size": 4, "speculative_ngram_max_match_window_size": 3}, "at most"),
])
def test_bad_speculative_settings_are_refused_naming_the_flag(config, message):
    with pytest.raises(ValueError, match=message):
        resolve_speculative_config(ServerConfig(**config))


def test_the_launcher_refuses_a_bad_speculative_config_in_one_line_with_exit_code_2():
    proc = subprocess.run([sys.executable, "-m", "zserve.launcher", "--speculative-config", '{"method": "medusa"}'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("launch_server: error: --speculative-config: method must be")
    proc = subprocess.run([sys.executable, "-m", "zserve.launcher", "--speculative-algorithm", "eagle"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_stats_line_shows_the_interval_drafts_once_speculation_drafted():
    logger = StatsLogger(interval_s=10.0, num_pages=100)
    start = SchedulerStats(num_drafts=10, num_draft_tokens=40, num_accepted_tokens=20, num_steps=1)
    logger.restart(0.0, start)
    line = logger.format_line(SchedulerStats(num_drafts=30, num_draft_tokens=120, num_accepted_tokens=80, num_steps=9), 10.0)
    assert line.endswith("; spec: 20 drafts, 75.0% of 80 draft tokens accepted, mean acceptance length 4.00"), line
    assert "spec" not in logger.format_line(SchedulerStats(num_steps=9), 10.0)


def test_metrics_export_the_spec_decode_counters():
    stats = StatsOut(req_id=1, scheduler=SchedulerStats(num_drafts=3, num_draft_tokens=12, num_accepted_tokens=7))
    text = ServerMetrics("tiny").render(stats).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["zserve_spec_decode_num_drafts_total"] == 3
    assert samples["zserve_spec_decode_num_draft_tokens_total"] == 12
    assert samples["zserve_spec_decode_num_accepted_tokens_total"] == 7
