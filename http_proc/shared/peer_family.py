"""PeerFamily: one of zserve's metric families shown again under vLLM's or SGLang's name.

The Grafana dashboards the peers publish query `vllm:*` and `sglang:*` families. At each scrape the
collector copies the samples of the zserve family a peer family names (renamed, relabelled), so the
values have one source: a peer series always equals its `zserve_*` series in the same scrape.

Labels: vLLM V1 labels every family with `model_name` and `engine` (the engine core's index; one
per server here, "0"), and its finish reason is `finished_reason`; SGLang labels with `model_name`.
The buckets are zserve's (histogram_quantile reads any buckets). Families a peer has and zserve has
no value for are left out (README, "Metrics under the peers' names"); a colon is legal in a
Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), which is how both peers name theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

VLLM_LABELS = (("engine", "0"),)
VLLM_RENAMED_LABELS = (("finish_reason", "finished_reason"),)


@dataclass(frozen=True, slots=True)
class PeerFamily:
    name: str  # the peer's family name, as prometheus_client names a family: a counter's without `_total`
    source: str  # the zserve family whose samples it shows
    extra_labels: tuple[tuple[str, str], ...] = ()  # label (name, value) pairs the peer adds to every series
    renamed_labels: tuple[tuple[str, str], ...] = ()  # (zserve label, the peer's name for it)

    def copy(self, source: Metric) -> Metric:
        """`source`'s samples under this name: `<source>_bucket` becomes `<name>_bucket`, and so on."""
        shown = f"{source.name}_total" if source.type == "counter" else source.name
        family = Metric(self.name, f"{source.documentation} (= {shown})", source.type)
        renamed = dict(self.renamed_labels)
        for sample in source.samples:
            labels = {renamed.get(key, key): value for key, value in sample.labels.items()}
            labels.update(self.extra_labels)
            family.add_sample(
                self.name + sample.name[len(source.name):], labels, sample.value, sample.timestamp, sample.exemplar,
            )
        return family


def _vllm(name: str, source: str) -> PeerFamily:
    return PeerFamily(f"vllm:{name}", f"zserve_{source}", VLLM_LABELS, VLLM_RENAMED_LABELS)


def _sglang(name: str, source: str) -> PeerFamily:
    return PeerFamily(f"sglang:{name}", f"zserve_{source}")


PEER_FAMILIES = (
    # vLLM (vllm/v1/metrics/loggers.py): scheduler gauges, KV usage as a 0..1 fraction, prefix cache in tokens
    _vllm("num_requests_running", "num_requests_running"),
    _vllm("num_requests_waiting", "num_requests_waiting"),
    _vllm("kv_cache_usage_perc", "kv_cache_usage_ratio"),
    _vllm("gpu_cache_usage_perc", "kv_cache_usage_ratio"),  # its name before 0.9, still read by older dashboards
    _vllm("prefix_cache_queries", "prompt_tokens"),
    _vllm("prefix_cache_hits", "prefix_hit_tokens"),
    _vllm("prompt_tokens", "prompt_tokens"),
    _vllm("generation_tokens", "generation_tokens"),
    _vllm("num_preemptions", "scheduler_retracted_requests"),
    _vllm("request_success", "request_outcomes"),
    _vllm("time_to_first_token_seconds", "time_to_first_token_seconds"),
    _vllm("time_per_output_token_seconds", "inter_token_latency_seconds"),  # V1 observes the same gap under both
    _vllm("inter_token_latency_seconds", "inter_token_latency_seconds"),
    _vllm("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    _vllm("request_queue_time_seconds", "queue_time_seconds"),
    _vllm("request_prompt_tokens", "request_prompt_tokens"),
    _vllm("request_generation_tokens", "request_generation_tokens"),
    _vllm("spec_decode_num_drafts", "spec_decode_num_drafts"),
    _vllm("spec_decode_num_draft_tokens", "spec_decode_num_draft_tokens"),
    _vllm("spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens"),
    # SGLang (python/sglang/srt/metrics/collector.py): scheduler gauges, the frontend's counters and histograms
    _sglang("num_running_reqs", "num_requests_running"),
    _sglang("num_queue_reqs", "num_requests_waiting"),
    _sglang("token_usage", "kv_cache_usage_ratio"),
    _sglang("cache_hit_rate", "prefix_cache_hit_rate"),
    _sglang("prompt_tokens", "prompt_tokens"),
    _sglang("generation_tokens", "generation_tokens"),
    _sglang("cached_tokens", "prefix_hit_tokens"),
    _sglang("num_retracted_requests", "scheduler_retracted_requests"),
    _sglang("time_to_first_token_seconds", "time_to_first_token_seconds"),
    _sglang("inter_token_latency_seconds", "inter_token_latency_seconds"),
    _sglang("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    _sglang("queue_time_seconds", "queue_time_seconds"),
)


def peer_families(families: Iterable[Metric]) -> Iterator[Metric]:
    """The peer families whose zserve source is among `families` (none while the scheduler is down)."""
    by_name = {metric.name: metric for metric in families}
    for peer in PEER_FAMILIES:
        source = by_name.get(peer.source)
        if source is not None:
            yield peer.copy(source)
