"""When each request is sent, as offsets in seconds from the start of a run."""

from __future__ import annotations

import numpy as np


def arrival_offsets_s(
    num_requests: int, submit_interval_ms: float | None = None, request_rate: float | None = None, seed: int = 0,
) -> list[float]:
    """Paced (`submit_interval_ms` apart), Poisson (`request_rate` per second, exponential gaps,
    seeded), or all at once (neither given). The first request goes at 0."""
    if submit_interval_ms is not None and request_rate is not None:
        raise ValueError("give at most one of submit_interval_ms and request_rate")
    if submit_interval_ms is not None:
        if submit_interval_ms < 0:
            raise ValueError(f"submit_interval_ms must be >= 0, got {submit_interval_ms}")
        return [i * submit_interval_ms / 1e3 for i in range(num_requests)]
    if request_rate is not None and request_rate != float("inf"):
        if request_rate <= 0:
            raise ValueError(f"request_rate must be > 0, got {request_rate}")
        gaps_s = np.random.default_rng(seed).exponential(1.0 / request_rate, size=num_requests)
        gaps_s[0] = 0.0
        return [float(x) for x in np.cumsum(gaps_s)]
    return [0.0] * num_requests


def describe_arrivals(submit_interval_ms: float | None, request_rate: float | None) -> str:
    if submit_interval_ms is not None:
        return f"paced, one every {submit_interval_ms:g} ms"
    if request_rate is not None and request_rate != float("inf"):
        return f"Poisson, {request_rate:g} req/s"
    return "all at once"
