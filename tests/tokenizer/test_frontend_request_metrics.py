"""RequestMetrics: latencies and outcomes of every request at the front door, one `finished` line
with token counts, TTFT and E2E; health probes counted nowhere."""

from __future__ import annotations

import logging

import numpy as np

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import PROBE_CLIENT_PREFIX, ReqOutput
from zserve.tokenizer_proc.request_metrics import RequestMetrics


def output(req_id: int, ids: list[int], finish: FinishReason | None = None, **kw) -> ReqOutput:
    return ReqOutput(req_id=req_id, text="x" * len(ids), token_ids=np.array(ids, np.int32), finish_reason=finish, **kw)


def test_a_request_moves_ttft_itl_e2e_and_lengths_and_logs_one_finished_line(caplog):
    metrics = RequestMetrics()
    metrics.on_admitted(7, "client-a", now_s=10.0)
    metrics.on_output(output(7, [5]), now_s=10.25)
    metrics.on_output(output(7, [6, 7]), now_s=10.5)
    with caplog.at_level(logging.INFO, logger="tokenizer_proc"):
        metrics.on_output(output(7, [8], FinishReason.LENGTH, prompt_tokens=12, completion_tokens=4, cached_tokens=8), now_s=11.0)
    h = metrics.histograms
    assert h["time_to_first_token_seconds"].count == 1 and h["time_to_first_token_seconds"].sum == 0.25
    assert h["inter_token_latency_seconds"].count == 2 and h["inter_token_latency_seconds"].sum == 0.75
    assert h["e2e_request_latency_seconds"].sum == 1.0
    assert h["request_prompt_tokens"].sum == 12 and h["request_generation_tokens"].sum == 4
    assert metrics.finished == {FinishReason.LENGTH: 1} and metrics.errors == {} and metrics.timings == {}
    assert caplog.messages == ["req 7 finished (length): 12 prompt tokens (8 cached), 4 output tokens; TTFT 250 ms, E2E 1000 ms"]


def test_refusals_and_errors_are_counted_by_code():
    metrics = RequestMetrics()
    metrics.on_refused(ErrorCode.INVALID)
    metrics.on_admitted(1, "c", now_s=0.0)
    metrics.on_output(output(1, [], FinishReason.ERROR, code=ErrorCode.BUSY), now_s=0.1)
    assert metrics.finished == {FinishReason.ERROR: 2} and metrics.errors == {ErrorCode.INVALID: 1, ErrorCode.BUSY: 1}
    assert metrics.histograms["time_to_first_token_seconds"].count == 0  # no output ever came


def test_health_probes_are_not_user_traffic(caplog):
    metrics = RequestMetrics()
    metrics.on_admitted(3, PROBE_CLIENT_PREFIX + "http", now_s=0.0)
    with caplog.at_level(logging.INFO, logger="tokenizer_proc"):
        metrics.on_output(output(3, [1], FinishReason.LENGTH, prompt_tokens=1, completion_tokens=1), now_s=0.1)
    assert caplog.messages == [] and metrics.finished == {} and metrics.timings == {}
    assert all(h.count == 0 for h in metrics.histograms.values())
