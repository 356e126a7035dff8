"""Histogram: fixed buckets counted in the process that sees the events, sent whole in StatsOut.

The frontend (every request passes it, whatever its door) counts TTFT, inter-token gaps, end
to end latency and token counts; the scheduler counts queue time. The HTTP process renders them
for Prometheus at each scrape (http_proc/shared/server_metrics.py), so `/metrics` covers ZMQ clients
too. `counts[i]` counts values <= bounds[i] (and > bounds[i - 1]); `counts[-1]` those above the
last bound.
"""

from __future__ import annotations

import bisect
from typing import Any

from msgspec import field

from zserve.common.wire import Message

TTFT_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
)
ITL_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
E2E_BOUNDS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
QUEUE_BOUNDS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKENS_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class Histogram(Message):
    bounds: list[float]  # upper bounds of the buckets, ascending
    counts: list[int] = field(default_factory=list)  # len(bounds) + 1 (the last: above every bound)
    sum: float = 0.0
    count: int = 0

    @staticmethod
    def of(bounds: tuple[float, ...]) -> Histogram:
        return Histogram(bounds=[float(b) for b in bounds], counts=[0] * (len(bounds) + 1))

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (le, values <= le), ending with +Inf."""
        total, out = 0, []
        for bound, num in zip([*map(_le, self.bounds), "+Inf"], self.counts, strict=True):
            total += num
            out.append((bound, total))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum, "count": self.count}


def _le(bound: float) -> str:
    return repr(float(bound))
