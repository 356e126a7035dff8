"""StatsLogger: a line per interval while busy, none while idle, figures from SchedulerStats deltas."""

from __future__ import annotations

from msgspec.structs import replace

from zserve.common.scheduler_stats import SchedulerStats
from zserve.scheduler_proc.stats_logger import StatsLogger


def test_first_call_starts_the_clock_and_logs_nothing():
    log = StatsLogger(interval_s=10.0, num_pages=100)
    assert log.maybe_log(1000.0, SchedulerStats(num_running=3)) is None
    assert log.due_in_s(1004.0) == 6.0


def test_a_busy_interval_logs_throughputs_and_gauges_from_the_deltas():
    log = StatsLogger(interval_s=10.0, num_pages=100)
    start = SchedulerStats(num_prefilled_tokens=100, num_generated_tokens=50, num_prompt_tokens=100, num_prefix_hit_tokens=0)
    log.maybe_log(0.0, start)
    now = replace(
        start, num_running=4, num_waiting=2, num_retracted=1, num_used_pages=30, num_reserved_pages=10,
        num_prefilled_tokens=1100, num_generated_tokens=250, num_prompt_tokens=500, num_prefix_hit_tokens=100, num_steps=40,
    )
    assert log.maybe_log(5.0, now) is None  # not due yet
    line = log.maybe_log(10.0, now)
    assert line == (
        "stats: prompt 100.0 tok/s, generation 20.0 tok/s; running 4, waiting 2, retracted 1 (total); "
        "KV 40.0% used; prefix cache hit 25.0%; 250 tokens generated (total)"
    )
    assert log.due_in_s(10.0) == 10.0  # the next interval starts at the line


def test_idle_intervals_log_nothing_and_do_not_ask_for_a_wakeup():
    log = StatsLogger(interval_s=1.0, num_pages=10)
    idle = SchedulerStats(num_steps=7, num_submitted=3)
    log.maybe_log(0.0, idle)
    assert not log.pending(idle)
    assert log.maybe_log(5.0, idle) is None
    # one step ran after the last line, then the server went idle: one last line is still owed
    stepped = replace(idle, num_steps=8, num_generated_tokens=1)
    assert log.pending(stepped)
    assert log.maybe_log(6.0, stepped) is not None
    assert not log.pending(stepped)


def test_interval_zero_turns_logging_off():
    log = StatsLogger(interval_s=0.0, num_pages=10)
    busy = SchedulerStats(num_running=1)
    log.maybe_log(0.0, busy)
    assert log.due_in_s(100.0) is None
    assert log.maybe_log(100.0, replace(busy, num_steps=5)) is None
