"""RequestMetrics: every request's latencies and outcome, counted at the front door.

Every request passes the frontend whatever its door (Python client, HTTP, raw frames), so its
histograms and counters cover them all; StatsOut carries them to whoever asks (`/metrics`).

    admitted (validated, sent to the scheduler) -> outputs -> the final output:
        TTFT      arrival -> the first output with text or tokens
        ITL       gap between consecutive outputs with tokens
        E2E       arrival -> the final output
        prompt and output token counts; the outcome by finish reason (and error code)

The final output also gives the request's one `finished` INFO line, with its token counts,
TTFT and E2E. Health probes (a client id starting with PROBE_CLIENT_PREFIX) are not user
traffic: they are counted nowhere and logged at DEBUG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.histogram import E2E_BOUNDS_S, ITL_BOUNDS_S, TOKENS_BOUNDS, TTFT_BOUNDS_S, Histogram
from zserve.common.messages import PROBE_CLIENT_PREFIX, ReqOutput

logger = logging.getLogger("tokenizer_proc")


@dataclass(slots=True)
class RequestTiming:
    arrival_s: float
    is_probe: bool
    first_output_s: float | None = None
    last_output_s: float | None = None


@dataclass
class RequestMetrics:
    histograms: dict[str, Histogram] = field(default_factory=lambda: {
        "time_to_first_token_seconds": Histogram.of(TTFT_BOUNDS_S),
        "inter_token_latency_seconds": Histogram.of(ITL_BOUNDS_S),
        "e2e_request_latency_seconds": Histogram.of(E2E_BOUNDS_S),
        "request_prompt_tokens": Histogram.of(TOKENS_BOUNDS),
        "request_generation_tokens": Histogram.of(TOKENS_BOUNDS),
    })
    finished: dict[FinishReason, int] = field(default_factory=dict)  # requests ended, by finish reason
    errors: dict[ErrorCode, int] = field(default_factory=dict)  # requests that ended in an error, by code
    timings: dict[int, RequestTiming] = field(default_factory=dict)  # req_id -> its timing, while in flight

    def on_admitted(self, req_id: int, client_id: str, now_s: float) -> None:
        self.timings[req_id] = RequestTiming(now_s, client_id.startswith(PROBE_CLIENT_PREFIX))

    def on_refused(self, code: ErrorCode) -> None:
        """A request the frontend refused before admitting it."""
        self._count_outcome(FinishReason.ERROR, code)

    def on_output(self, out: ReqOutput, now_s: float) -> None:
        timing = self.timings.get(out.req_id)
        if timing is None:
            return
        if len(out.token_ids) or out.text:
            if timing.first_output_s is None:
                timing.first_output_s = now_s
                if not timing.is_probe:
                    self.histograms["time_to_first_token_seconds"].observe(now_s - timing.arrival_s)
            elif not timing.is_probe:
                self.histograms["inter_token_latency_seconds"].observe(now_s - timing.last_output_s)
            timing.last_output_s = now_s
        if out.finish_reason is not None:
            del self.timings[out.req_id]
            self._on_finished(out, timing, now_s)

    def _on_finished(self, out: ReqOutput, timing: RequestTiming, now_s: float) -> None:
        e2e_s = now_s - timing.arrival_s
        ttft = "-" if timing.first_output_s is None else f"{1000 * (timing.first_output_s - timing.arrival_s):.0f} ms"
        how = out.finish_reason.text if out.code is None else f"{out.finish_reason.text}: {out.code.text}"
        logger.log(
            logging.DEBUG if timing.is_probe else logging.INFO,
            "req %d finished (%s): %d prompt tokens (%d cached), %d output tokens; TTFT %s, E2E %.0f ms",
            out.req_id, how, out.prompt_tokens, out.cached_tokens, out.completion_tokens, ttft, 1000 * e2e_s,
        )
        if timing.is_probe:
            return
        self.histograms["e2e_request_latency_seconds"].observe(e2e_s)
        self.histograms["request_prompt_tokens"].observe(out.prompt_tokens)
        self.histograms["request_generation_tokens"].observe(out.completion_tokens)
        self._count_outcome(out.finish_reason, out.code)

    def _count_outcome(self, finish_reason: FinishReason, code: ErrorCode | None) -> None:
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        if code is not None:
            self.errors[code] = self.errors.get(code, 0) + 1
