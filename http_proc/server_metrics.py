"""Prometheus metrics of the HTTP process, in its own registry (no global state).

Two sources:
- the scheduler's stats (`AsyncClient.stats()`, fetched at each scrape): gauges of requests and
  KV pages, token totals and request outcome totals for the whole server, ZMQ clients included;
- this process's own requests: latency histograms (TTFT, inter-token, end to end), and counts
  of HTTP responses by route and status, aborted requests by cause, and failed requests by status.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "zserve"
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)

# (stats key, metric name, help)
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
    ("num_aborted", "scheduler_requests_aborted", "requests the scheduler ended early (client aborts, disconnects, shutdown)"),
    ("num_refused", "scheduler_requests_refused", "requests the scheduler refused at submit (busy, cannot fit)"),
    ("num_retracted", "scheduler_retracted_requests", "retractions: running requests sent back to the queue to free KV pages (they resume)"),
    ("num_steps", "scheduler_steps", "scheduler steps run"),
)


class SchedulerStatsCollector(Collector):
    """Exposes the last stats snapshot it was given (`update` before each scrape)."""

    def __init__(self) -> None:
        self.stats: dict | None = None

    def update(self, stats: dict | None) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(f"{PREFIX}_scheduler_up", "1 if the scheduler answered this scrape's stats request")
        up.add_metric([], 0 if self.stats is None else 1)
        yield up
        if self.stats is None:
            return
        for key, name, doc in STAT_GAUGES:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=self.stats.get(key, 0))
        for key, name, doc in STAT_COUNTERS:
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=self.stats.get(key, 0))
        num_prompt = self.stats.get("num_prompt_tokens", 0)
        hit_rate = self.stats.get("num_prefix_hit_tokens", 0) / num_prompt if num_prompt else 0.0
        yield GaugeMetricFamily(
            f"{PREFIX}_prefix_cache_hit_rate", "prefix-hit prompt tokens / prompt tokens since start", value=hit_rate
        )


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.scheduler_stats = SchedulerStatsCollector()
        self.registry.register(self.scheduler_stats)
        self.ttft_s = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "HTTP requests: time from arrival to the first generated text",
            buckets=TTFT_BUCKETS_S, registry=self.registry,
        )
        self.inter_token_s = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "HTTP requests: gap between consecutive streamed outputs",
            buckets=ITL_BUCKETS_S, registry=self.registry,
        )
        self.e2e_s = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "HTTP requests: time from arrival to the last output",
            buckets=E2E_BUCKETS_S, registry=self.registry,
        )
        self.http_responses = Counter(
            f"{PREFIX}_http_responses", "HTTP responses by route and status code", ["route", "status"], registry=self.registry
        )
        self.aborted = Counter(
            f"{PREFIX}_requests_aborted", "HTTP generation requests aborted, by cause (client_disconnect, server)",
            ["cause"], registry=self.registry,
        )
        self.failed = Counter(
            f"{PREFIX}_requests_failed", "HTTP generation requests that ended in an error, by status code",
            ["status"], registry=self.registry,
        )

    def count_response(self, route: str, status: int) -> None:
        self.http_responses.labels(route, str(status)).inc()

    def count_failed(self, status: int) -> None:
        self.failed.labels(str(status)).inc()

    def count_aborted(self, cause: str) -> None:
        self.aborted.labels(cause).inc()

    def render(self, stats: dict | None) -> bytes:
        """The Prometheus text exposition, with `stats` (None: the scheduler did not answer)."""
        self.scheduler_stats.update(stats)
        return generate_latest(self.registry)
