"""Per-request timings and the run's summary, with the common definitions (SGLang / vLLM):

    TTFT     first text since send
    TPOT     (latency - ttft) / (output_tokens - 1), per request with at least 2 output tokens
    ITL      gaps between consecutive streamed chunks that carry text, pooled over requests
    latency  last output (the finish) since send (end-to-end)

Throughputs divide by the run's duration: from the first send to the last finish. Failed
requests (an exception, or finish reason "error"/"abort") count only as failures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass(slots=True)
class RequestRecord:
    send_s: float  # absolute (perf_counter) time of the send
    chunk_times_s: list[float] = field(default_factory=list)  # each text chunk's arrival, since send
    latency_s: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.latency_s is not None and self.finish_reason in ("stop", "length")

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else self.latency_s

    @property
    def tpot_s(self) -> float | None:
        if self.num_output_tokens < 2 or self.latency_s is None or self.ttft_s is None:
            return None
        return (self.latency_s - self.ttft_s) / (self.num_output_tokens - 1)

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:], strict=False)]


@dataclass(frozen=True, slots=True)
class Distribution:
    """mean and percentiles of one latency, in milliseconds (NaN when there is no sample)."""

    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    num_samples: int

    @staticmethod
    def of_seconds(values_s: list[float]) -> Distribution:
        if not values_s:
            nan = float("nan")
            return Distribution(nan, nan, nan, nan, 0)
        ms = np.asarray(values_s, dtype=np.float64) * 1e3
        p50, p95, p99 = (float(np.percentile(ms, q)) for q in PERCENTILES)
        return Distribution(float(ms.mean()), p50, p95, p99, len(ms))


@dataclass(frozen=True, slots=True)
class RunMetrics:
    num_requests: int
    num_completed: int
    num_failed: int
    duration_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens the server reported as prefix-cache hits
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_throughput: float  # (prompt + output) tokens / s
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    latency: Distribution

    @staticmethod
    def of_records(records: list[RequestRecord], start_s: float) -> RunMetrics:
        ok = [r for r in records if r.ok]
        ends_s = [r.send_s + r.latency_s for r in ok]
        duration_s = max(ends_s) - start_s if ends_s else float("nan")
        num_prompt = sum(r.num_prompt_tokens for r in ok)
        num_output = sum(r.num_output_tokens for r in ok)
        per_s = (lambda x: x / duration_s) if ends_s and duration_s > 0 else (lambda x: float("nan"))
        return RunMetrics(
            num_requests=len(records),
            num_completed=len(ok),
            num_failed=len(records) - len(ok),
            duration_s=duration_s,
            num_prompt_tokens=num_prompt,
            num_output_tokens=num_output,
            num_cached_tokens=sum(r.num_cached_tokens for r in ok),
            request_throughput=per_s(len(ok)),
            output_throughput=per_s(num_output),
            total_throughput=per_s(num_prompt + num_output),
            ttft=Distribution.of_seconds([r.ttft_s for r in ok]),
            tpot=Distribution.of_seconds([r.tpot_s for r in ok if r.tpot_s is not None]),
            itl=Distribution.of_seconds([gap for r in ok for gap in r.itls_s]),
            latency=Distribution.of_seconds([r.latency_s for r in ok]),
        )

    def flat(self) -> dict[str, float]:
        """{'ttft.p99_ms': ..., 'output_throughput': ..., ...}: the numbers a table or a ratio needs."""
        out: dict[str, float] = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                out.update({f"{key}.{k}": float(v) for k, v in value.items()})
            else:
                out[key] = float(value)
        return out
