"""Prometheus metrics of the server, rendered by the HTTP process in its own registry.

Two sources, both labelled `model_name` (the served name, as vLLM's and SGLang's dashboards expect):
- the server's stats (`AsyncClient.stats_out()`, fetched at each scrape), which count every request
  whatever its door (ZMQ clients included): the scheduler's gauges of requests and KV pages, its
  token, outcome and retraction totals and its queue-time histogram; the frontend's latency and
  length histograms (TTFT, inter-token, end to end, prompt and output tokens) and its outcome
  counts by finish reason and error code;
- this process's own HTTP traffic: responses by route and status, aborted requests by cause,
  failed requests by status.
The server's families appear again under vLLM's and SGLang's names (`vllm:*`, `sglang:*`), copied
from the `zserve_*` ones at each scrape (shared/peer_family.py).
No `_created` series (prometheus_client's are turned off in this process).
"""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from zserve.common.messages import StatsOut
from zserve.common.scheduler_stats import SchedulerStats
from zserve.http_proc.shared.peer_family import peer_families

PREFIX = "zserve"

# (SchedulerStats field, metric name, help)
STAT_GAUGES = (
    ("num_running", "num_requests_running", "requests prefilled and generating"),
    ("num_waiting", "num_requests_waiting", "requests queued, not yet admitted"),
    ("num_prefilling", "num_requests_prefilling", "requests admitted with prompt left to prefill (chunked)"),
    ("num_used_pages", "kv_pages_used", "KV pages owned by live requests, outside the prefix cache"),
    ("num_cached_pages", "kv_pages_cached", "KV pages held by the prefix cache"),
    ("num_evictable_pages", "kv_pages_evictable", "cached KV pages no request holds (reclaimable)"),
    ("num_free_pages", "kv_pages_free", "free KV pages"),
)
STAT_COUNTERS = (
    ("num_prompt_tokens", "prompt_tokens", "prompt tokens of admitted requests"),
    ("num_prefix_hit_tokens", "prefix_hit_tokens", "prompt tokens served by the prefix cache"),
    ("num_generated_tokens", "generation_tokens", "tokens generated"),
    ("num_finished", "requests_finished", "requests finished by the scheduler (stop or length)"),
    ("num_aborted", "scheduler_requests_aborted",
     "requests the scheduler ended early (client aborts, disconnects, shutdown)"),
    ("num_refused", "scheduler_requests_refused", "requests the scheduler refused at submit (busy, cannot fit)"),
    ("num_retracted", "scheduler_retracted_requests",
     "retractions: running requests sent back to the queue to free KV pages (they resume)"),
    ("num_steps", "scheduler_steps", "scheduler steps run"),
    # speculative decoding (vLLM's vllm:spec_decode_* names); 0 while --speculative-algorithm is none
    ("num_drafts", "spec_decode_num_drafts", "decode rows that carried speculative drafts (one per request per step)"),
    ("num_draft_tokens", "spec_decode_num_draft_tokens", "speculative draft tokens verified by the model"),
    ("num_accepted_tokens", "spec_decode_num_accepted_tokens", "speculative draft tokens accepted"),
)


HISTOGRAM_HELP = {  # StatsOut histogram name -> help
    "time_to_first_token_seconds":
        "time from a request's arrival at the frontend to its first output with text or tokens",
    "inter_token_latency_seconds": "gap between consecutive outputs with tokens of one request",
    "e2e_request_latency_seconds": "time from a request's arrival at the frontend to its final output",
    "queue_time_seconds": "time a request waited in the scheduler's queue before its first admission",
    "request_prompt_tokens": "prompt tokens per finished request",
    "request_generation_tokens": "output tokens per finished request",
}
OUTCOMES_HELP = "requests ended at the frontend, by finish reason (every door)"
ERRORS_HELP = "requests that ended in an error, by error code: invalid and busy are refusals"


class ServerStatsCollector(Collector):
    """Exposes the last stats snapshot it was given (`update` before each scrape)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: StatsOut | None = None

    def update(self, stats: StatsOut | None) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        families = list(self._zserve_families())
        yield from families
        yield from peer_families(families)

    def _zserve_families(self) -> Iterator[Metric]:
        label = ["model_name"]
        up = GaugeMetricFamily(
            f"{PREFIX}_scheduler_up", "1 if the scheduler answered this scrape's stats request", labels=label,
        )
        up.add_metric([self.model_name], 0 if self.stats is None or self.stats.scheduler is None else 1)
        yield up
        if self.stats is None or self.stats.scheduler is None:
            return
        sched = self.stats.scheduler
        for field, name, doc in STAT_GAUGES:
            yield self._one(GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=label), getattr(sched, field))
        for field, name, doc in STAT_COUNTERS:
            yield self._one(CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=label), getattr(sched, field))
        hit_rate = sched.num_prefix_hit_tokens / sched.num_prompt_tokens if sched.num_prompt_tokens else 0.0
        yield self._one(GaugeMetricFamily(
            f"{PREFIX}_prefix_cache_hit_rate", "prefix-hit prompt tokens / prompt tokens since start", labels=label),
            hit_rate)
        yield self._one(GaugeMetricFamily(
            f"{PREFIX}_kv_cache_usage_ratio", "KV pages held by live requests or promised to them, over the pool (0-1)",
            labels=label), kv_usage_ratio(sched))
        frontend = self.stats.frontend
        outcomes = CounterMetricFamily(f"{PREFIX}_request_outcomes", OUTCOMES_HELP, labels=[*label, "finish_reason"])
        errors = CounterMetricFamily(f"{PREFIX}_request_errors", ERRORS_HELP, labels=[*label, "code"])
        if frontend is not None:
            for reason, num in frontend.num_finished.items():
                outcomes.add_metric([self.model_name, reason.text], num)
            for code, num in frontend.num_errors.items():
                errors.add_metric([self.model_name, code.text], num)
        yield outcomes
        yield errors
        for name, h in self.stats.histograms.items():
            family = HistogramMetricFamily(f"{PREFIX}_{name}", HISTOGRAM_HELP.get(name, name), labels=label)
            family.add_metric([self.model_name], buckets=h.cumulative(), sum_value=h.sum)
            yield family

    def _one(self, family, value: float):
        family.add_metric([self.model_name], value)
        return family


def kv_usage_ratio(stats: SchedulerStats) -> float:
    """Pages owned by live requests plus those promised to them, over every page of the pool."""
    num_pages = stats.num_free_pages + stats.num_cached_pages + stats.num_used_pages
    if not num_pages:
        return 0.0
    return min(1.0, (stats.num_used_pages + stats.num_reserved_pages) / num_pages)


class ServerMetrics:
    def __init__(self, model_name: str = "") -> None:
        prometheus_client.disable_created_metrics()  # process-wide: this process renders only these metrics
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.server_stats = ServerStatsCollector(model_name)
        self.registry.register(self.server_stats)
        self.http_responses = Counter(
            f"{PREFIX}_http_responses", "HTTP responses by route and status code", ["model_name", "route", "status"],
            registry=self.registry,
        )
        self.aborted = Counter(
            f"{PREFIX}_requests_aborted", "HTTP generation requests aborted, by cause (client_disconnect, server)",
            ["model_name", "cause"], registry=self.registry,
        )
        self.failed = Counter(
            f"{PREFIX}_requests_failed", "HTTP generation requests that ended in an error, by status code",
            ["model_name", "status"], registry=self.registry,
        )

    def count_response(self, route: str, status: int) -> None:
        self.http_responses.labels(self.model_name, route, str(status)).inc()

    def count_failed(self, status: int) -> None:
        self.failed.labels(self.model_name, str(status)).inc()

    def count_aborted(self, cause: str) -> None:
        self.aborted.labels(self.model_name, cause).inc()

    def render(self, stats: StatsOut | None) -> bytes:
        """The Prometheus text exposition, with `stats` (None: the scheduler did not answer)."""
        self.server_stats.update(stats)
        return generate_latest(self.registry)
