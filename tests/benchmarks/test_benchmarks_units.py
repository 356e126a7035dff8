"""The benchmark helpers that need no server: workloads, arrivals, metric definitions, ratios."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks.arrival_schedule import arrival_offsets_s
from benchmarks.config_runs import ConfigRuns
from benchmarks.json_report import write_json
from benchmarks.load_driver import LoadRun
from benchmarks.metrics import Distribution, RequestRecord, RunMetrics
from benchmarks.results_table import render_table
from benchmarks.workloads import (
    LengthRange,
    echo_workload,
    parse_counts,
    random_workload,
    repeats_workload,
    shared_prefix_workload,
)


def test_repeats_cycle_and_uniqueness():
    reqs = repeats_workload("ab ", [1, 1, 3], 5, max_tokens=7)
    assert [r.prompt for r in reqs] == ["ab ", "ab ", "ab ab ab ", "ab ", "ab "]
    assert all(r.max_tokens == 7 and r.input_ids is None for r in reqs)
    suffixed = repeats_workload("ab ", [2], 3, 1, unique="suffix", salt="S. ")
    assert len({r.prompt for r in suffixed}) == 3 and all(r.prompt.startswith("S. ab ab ") for r in suffixed)
    prefixed = repeats_workload("ab ", [2], 3, 1, unique="prefix")
    assert len({r.prompt[:12] for r in prefixed}) == 3
    assert parse_counts("1,1,1,64") == [1, 1, 1, 64]
    with pytest.raises(ValueError):
        parse_counts("1,0")


def test_echo_workload_asks_for_copies_of_its_own_text():
    from benchmarks.echo_corpus import CODE, PROSE

    reqs = echo_workload(6, max_tokens=200, seed=0, salt=1)
    assert [r.max_tokens for r in reqs] == [200] * 6 and all(r.messages and r.messages[0][0] == "user" for r in reqs)
    texts = [r.messages[0][1] for r in reqs]
    assert "spelling" in texts[0] and "word for word" in texts[1] and "```python" in texts[2]
    assert PROSE[4] in texts[1] and CODE[2] in texts[2]  # the text to copy is in the prompt as it is
    fixed = texts[0].split("\n\n", 1)[1]
    assert fixed != PROSE[0] and len(fixed) == len(PROSE[0])  # typos: neighbouring letters swapped
    assert len(set(texts)) == 6 and echo_workload(6, 200, 0, salt=1) == reqs and echo_workload(6, 200, 0, salt=2) != reqs


def test_random_lengths_follow_the_convention_and_salt_changes_only_ids():
    lens = LengthRange.from_ratio(512, 0.0625)
    assert (lens.min_len, lens.max_len) == (32, 512)
    assert LengthRange.from_ratio(256, 0.5, min_len=32) == LengthRange(32, 256)
    assert LengthRange.from_ratio(10, 1.0) == LengthRange(10, 10)
    ids = np.arange(10, 100)
    a = random_workload(ids, 50, LengthRange(3, 9), LengthRange(2, 4), seed=1)
    b = random_workload(ids, 50, LengthRange(3, 9), LengthRange(2, 4), seed=1, salt=1)
    assert [len(r.input_ids) for r in a] == [len(r.input_ids) for r in b]
    assert [r.max_tokens for r in a] == [r.max_tokens for r in b]
    assert [r.input_ids for r in a] != [r.input_ids for r in b]
    assert {len(r.input_ids) for r in a} <= set(range(3, 10)) and {r.max_tokens for r in a} <= {2, 3, 4}
    assert all(10 <= t < 100 for r in a for t in r.input_ids)


def test_shared_prefix_groups_share_their_system_prompt():
    reqs = shared_prefix_workload(np.arange(5, 500), num_groups=3, prompts_per_group=4, system_len=20, question_len=5,
                                  max_tokens=8, seed=0)
    assert len(reqs) == 12 and all(len(r.input_ids) == 25 for r in reqs)
    groups = [reqs[i::3] for i in range(3)]  # round-robin order
    for group in groups:
        assert len({r.input_ids[:20] for r in group}) == 1
        assert len({r.input_ids[20:] for r in group}) == 4
    assert len({g[0].input_ids[:20] for g in groups}) == 3


def test_arrivals():
    assert arrival_offsets_s(3, submit_interval_ms=250) == [0.0, 0.25, 0.5]
    assert arrival_offsets_s(4) == [0.0] * 4
    poisson = arrival_offsets_s(2000, request_rate=10.0, seed=3)
    assert poisson[0] == 0.0 and all(b >= a for a, b in zip(poisson, poisson[1:], strict=False))
    assert 180 < poisson[-1] < 220  # about 2000 / 10 s
    assert poisson == arrival_offsets_s(2000, request_rate=10.0, seed=3)
    with pytest.raises(ValueError):
        arrival_offsets_s(2, submit_interval_ms=1, request_rate=1)


def record(send_s, chunks, latency, num_out, num_prompt=10) -> RequestRecord:
    return RequestRecord(send_s, list(chunks), latency, num_prompt, num_out, 0, "length")


def test_metric_definitions():
    a = record(0.0, [0.1, 0.3, 0.6], 0.6, num_out=3)  # TPOT (0.6 - 0.1) / 2
    b = record(1.0, [0.2], 0.2, num_out=1)  # one token: no TPOT, no ITL
    failed = RequestRecord(0.5, [0.1], None, error="ServerError: boom")
    m = RunMetrics.of_records([a, b, failed], start_s=0.0)
    assert (m.num_requests, m.num_completed, m.num_failed) == (3, 2, 1)
    assert m.duration_s == pytest.approx(1.2)  # last finish at 1.0 + 0.2
    assert m.ttft.mean_ms == pytest.approx(150.0) and m.ttft.num_samples == 2
    assert m.tpot.p50_ms == pytest.approx(250.0) and m.tpot.num_samples == 1
    assert sorted(a.itls_s) == pytest.approx([0.2, 0.3]) and m.itl.num_samples == 2
    assert m.latency.p99_ms == pytest.approx(np.percentile([600.0, 200.0], 99))
    assert m.output_throughput == pytest.approx(4 / 1.2)
    assert m.total_throughput == pytest.approx(24 / 1.2)
    assert m.request_throughput == pytest.approx(2 / 1.2)
    assert math.isnan(Distribution.of_seconds([]).p99_ms)


def test_ratios_are_per_repeat_and_json_is_strict(tmp_path):
    def load(scale: float) -> LoadRun:
        recs = [record(0.0, [0.1 * scale, 0.2 * scale], 0.2 * scale, 2)]
        return LoadRun(recs, 0.0, {"num_prompt_tokens": 0}, {"num_prompt_tokens": 10, "num_prefix_hit_tokens": 5})

    base, other = ConfigRuns("base", []), ConfigRuns("other", [])
    for scale_base, scale_other in ((1.0, 2.0), (3.0, 3.0), (1.0, 4.0)):  # per-repeat ratios 2, 1, 4
        base.add(load(scale_base))
        other.add(load(scale_other))
    assert other.ratio_to(base)["ttft.p99_ms"] == pytest.approx(2.0)
    assert base.median()["prefix_hit_rate"] == pytest.approx(0.5)
    table = render_table([base, other], "title")
    assert "TTFT p99 (ms)" in table and "[1]/[0]" in table
    path = tmp_path / "r.json"
    write_json(path, {"x": float("nan"), "runs": [other.to_json(base)]})
    data = json.loads(path.read_text())  # NaN is not JSON: it is written as null
    assert data["x"] is None and data["runs"][0]["ratio_to_baseline"]["ttft.p99_ms"] == pytest.approx(2.0)
