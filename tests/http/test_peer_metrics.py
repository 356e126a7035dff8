"""/metrics under the peers' names without a server: every `vllm:` and `sglang:` family a dashboard reads holds its
zserve source's samples, with the peer's labels (served: tests/http/test_http_server.py)."""

from __future__ import annotations

import pytest

from testing.peer_metrics import SGLANG_SERIES, VLLM_SERIES, peer_mismatches, scrape_samples
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.histogram import QUEUE_BOUNDS_S, Histogram
from zserve.common.messages import FrontendStats, StatsOut
from zserve.common.scheduler_stats import SchedulerStats
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.tokenizer_proc.request_metrics import RequestMetrics


def busy_stats() -> StatsOut:
    histograms = RequestMetrics().histograms
    for value in (0.003, 0.2, 7.0):
        for name, h in histograms.items():
            h.observe(100 * value if name.endswith("tokens") else value)
    histograms["queue_time_seconds"] = Histogram.of(QUEUE_BOUNDS_S)
    histograms["queue_time_seconds"].observe(0.05)
    scheduler = SchedulerStats(
        num_running=2, num_waiting=3, num_prompt_tokens=40, num_prefix_hit_tokens=12, num_generated_tokens=17,
        num_retracted=1, num_free_pages=6, num_cached_pages=2, num_used_pages=3, num_reserved_pages=1,
        num_drafts=4, num_draft_tokens=8, num_accepted_tokens=5,
    )
    frontend = FrontendStats(
        num_in_flight=5, is_draining=False,
        num_finished={FinishReason.LENGTH: 5, FinishReason.STOP: 2, FinishReason.ERROR: 1},
        num_errors={ErrorCode.INVALID: 1},
    )
    return StatsOut(req_id=1, scheduler=scheduler, frontend=frontend, histograms=histograms)


def test_every_peer_family_equals_its_zserve_source():
    text = ServerMetrics("tiny").render(busy_stats()).decode()
    assert peer_mismatches(text) == []
    samples = scrape_samples(text)
    names = {name for name, _ in samples}
    assert set(VLLM_SERIES) <= names and set(SGLANG_SERIES) <= names, sorted(set(VLLM_SERIES + SGLANG_SERIES) - names)
    vllm, sglang = (("engine", "0"), ("model_name", "tiny")), (("model_name", "tiny"),)
    assert samples[("vllm:num_requests_running", vllm)] == samples[("sglang:num_running_reqs", sglang)] == 2
    assert samples[("vllm:num_requests_waiting", vllm)] == samples[("sglang:num_queue_reqs", sglang)] == 3
    assert samples[("vllm:prompt_tokens_total", vllm)] == samples[("vllm:prefix_cache_queries_total", vllm)] == 40
    assert samples[("vllm:prefix_cache_hits_total", vllm)] == samples[("sglang:cached_tokens_total", sglang)] == 12
    assert samples[("sglang:generation_tokens_total", sglang)] == samples[("vllm:generation_tokens_total", vllm)] == 17
    assert samples[("sglang:cache_hit_rate", sglang)] == 12 / 40
    usage = (3 + 1) / (6 + 2 + 3)  # (used + reserved) / the pool, a 0..1 fraction as vLLM's "perc" is
    assert samples[("vllm:kv_cache_usage_perc", vllm)] == samples[("vllm:gpu_cache_usage_perc", vllm)] == usage
    assert samples[("sglang:token_usage", sglang)] == usage
    for reason, num in (("length", 5), ("stop", 2), ("error", 1)):
        assert samples[("vllm:request_success_total", (("engine", "0"), ("finished_reason", reason), ("model_name", "tiny")))] == num
    for name in ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "sglang:e2e_request_latency_seconds", "vllm:time_per_output_token_seconds",
                 "vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds"):
        labels = vllm if name.startswith("vllm:") else sglang
        assert samples[(f"{name}_count", labels)] == 3 and samples[(f"{name}_sum", labels)] == pytest.approx(7.203)
        assert samples[(f"{name}_bucket", tuple(sorted((*labels, ("le", "+Inf")))))] == 3
    assert samples[("vllm:request_queue_time_seconds_count", vllm)] == samples[("sglang:queue_time_seconds_count", sglang)] == 1
    assert samples[("vllm:num_preemptions_total", vllm)] == samples[("sglang:num_retracted_requests_total", sglang)] == 1
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", vllm)] == 5


def test_a_peer_value_that_differs_from_its_source_is_caught():
    """The check is not vacuous: one peer value changed, one label dropped, each is reported."""
    text = ServerMetrics("tiny").render(busy_stats()).decode()
    changed = text.replace('sglang:prompt_tokens_total{model_name="tiny"} 40.0', 'sglang:prompt_tokens_total{model_name="tiny"} 41.0')
    assert changed != text and [p for p in peer_mismatches(changed) if p.startswith("sglang:prompt_tokens")]
    unlabelled = text.replace('vllm:num_requests_running{engine="0",model_name="tiny"}', 'vllm:num_requests_running{model_name="tiny"}')
    assert unlabelled != text and [p for p in peer_mismatches(unlabelled) if "vllm:num_requests_running" in p]


def test_no_peer_family_while_the_scheduler_is_down():
    text = ServerMetrics("tiny").render(None).decode()
    assert peer_mismatches(text) == []
    assert not [name for name, _ in scrape_samples(text) if name.startswith(("vllm:", "sglang:"))]
