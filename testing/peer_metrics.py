"""Reads a /metrics text for the peers' families (http_proc/shared/peer_family.py): each `vllm:` and
`sglang:` family must hold exactly its zserve source's samples, renamed and relabelled."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from zserve.http_proc.shared.peer_family import PEER_FAMILIES

# what the peers' Grafana dashboards read, as the scrape spells the series (a counter's with `_total`)
VLLM_SERIES = (
    "vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
    "vllm:time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
)
SGLANG_SERIES = (
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_count",
    "sglang:e2e_request_latency_seconds_count", "sglang:token_usage", "sglang:cache_hit_rate",
)
Key = tuple[str, tuple[tuple[str, str], ...]]


def scrape_samples(text: str) -> dict[Key, float]:
    """Every sample by (series name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def peer_mismatches(text: str) -> list[str]:
    """What differs between each peer family and its source in one scrape (empty: all equal), and
    any peer series whose labels are not the peer's (model_name, and vLLM's engine)."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    problems = []
    for peer in PEER_FAMILIES:
        source, shown = families.get(peer.source), families.get(peer.name)
        if source is None:
            problems += [f"{peer.name}: shown without its source {peer.source}"] if shown is not None else []
            continue
        if shown is None or shown.type != source.type:
            problems.append(f"{peer.name}: missing or not a {source.type} like {peer.source}")
            continue
        renamed = dict(peer.renamed_labels)
        expected = {
            (peer.name + s.name[len(source.name):],
             tuple(sorted({**{renamed.get(k, k): v for k, v in s.labels.items()}, **dict(peer.extra_labels)}.items()))):
            s.value
            for s in source.samples
        }
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in shown.samples}
        if got != expected:
            problems.append(f"{peer.name}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}")
        base = {"model_name", "engine"} if peer.name.startswith("vllm:") else {"model_name"}
        for name, labels in got:
            if base - {k for k, _ in labels} or {k for k, _ in labels} - base - {"le", "finished_reason"}:
                problems.append(f"{name}: labels {labels}")
    return problems
