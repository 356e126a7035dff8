"""StepTimeBound: a step's prefill chunk sized from the measured cost per token, so that running decodes do not
freeze for longer than a target (`--max-step-ms`).

The token budget (`--chunked-prefill-size`) is a count of tokens, and what a token costs depends on the CPU: on a
2-vCPU AVX-512 Xeon without BF16 a 512-token chunk beside 8 decoding streams takes 1.7 s, and those streams wait
that long for their next token. This owner learns two costs from the worker's own timing of each step
(StepResult.forward_ms, as the scheduler records it):

    decode_ms          a step of decode rows only (EWMA)
    prefill_ms/token   (a prefill step's time - decode_ms when decode rows rode along), over its prompt tokens:
                       the two EWMAs' ratio, so a long chunk weighs more than a short prompt's fixed costs

and, while requests are decoding, gives the step's prefill part the tokens that fit the target:

    target_ms = --max-step-ms, or AUTO_DECODE_MULTIPLE x decode_ms when the flag is 0 (auto)
    budget    = (target_ms - decode_ms) / prefill_ms per token, within [MIN_CHUNK_TOKENS, --chunked-prefill-size]

so the prompt keeps most of each step (two thirds of it under auto) and a stream's gap stays near the target. With
nothing decoding, or before both costs are measured, the whole token budget goes to the prompt, as without the bound.
`--max-step-ms -1` (any value below 0, the default) turns it off: the bound costs a long prompt's TTFT and a
burst's throughput (BENCHMARKS.md section 30), so it is for servers whose streams must not freeze. What a token
costs grows with the context the chunk attends to and shrinks with the rows a GEMM gets (small chunks lose the
many-row kernels); the EWMAs follow both, step after step.
"""

from __future__ import annotations

import math

AUTO_DECODE_MULTIPLE = 3.0  # auto: a step with a prefill chunk takes at most this many decode-only steps
MIN_CHUNK_TOKENS = 16  # the least a prompt gets per step beside decodes, so it always moves on
EWMA_WEIGHT = 0.3  # the newest step's share of each estimate


class StepTimeBound:
    def __init__(self, max_step_ms: float, max_prefill_tokens: int):
        if math.isnan(max_step_ms):
            raise ValueError(f"max_step_ms must be a number (0 = auto, -1 = no bound), got {max_step_ms}")
        self.max_step_ms = math.inf if max_step_ms < 0 else max_step_ms  # no bound: no step is too long
        self.max_prefill_tokens = max_prefill_tokens
        self.decode_ms: float | None = None  # a decode-only step
        self._prefill_ms: float | None = None  # a prefill part's time, and its tokens (EWMAs)
        self._prefill_tokens: float | None = None
        self.last_budget_tokens = 0  # the last budget chosen beside decodes (0: none yet), for the stats line

    @property
    def enabled(self) -> bool:
        return math.isfinite(self.max_step_ms)

    def target_ms(self) -> float | None:
        """The bound on a step with decodes in it, or None while it cannot be known yet."""
        if self.max_step_ms > 0:
            return self.max_step_ms
        return None if self.decode_ms is None else AUTO_DECODE_MULTIPLE * self.decode_ms

    def observe(self, num_prefill_tokens: int, num_decode_rows: int, forward_ms: float) -> None:
        """One step as the worker timed it."""
        if forward_ms <= 0:
            return
        if num_prefill_tokens == 0:
            if num_decode_rows > 0:
                self.decode_ms = _ewma(self.decode_ms, forward_ms)
            return
        decode_part_ms = (self.decode_ms or 0.0) if num_decode_rows > 0 else 0.0
        self._prefill_ms = _ewma(self._prefill_ms, max(forward_ms - decode_part_ms, 0.0))
        self._prefill_tokens = _ewma(self._prefill_tokens, float(num_prefill_tokens))

    @property
    def prefill_ms_per_token(self) -> float | None:
        if self._prefill_ms is None or not self._prefill_tokens:
            return None
        return self._prefill_ms / self._prefill_tokens

    def prefill_budget(self, num_running: int, decodes_ride_along: bool) -> int:
        """The prompt tokens this step may compute: the whole budget with nothing decoding, else what fits the
        target beside the decode rows (`decodes_ride_along`: they run in this step, mixed) or before them."""
        if not self.enabled or num_running == 0:
            return self.max_prefill_tokens
        target_ms = self.target_ms()
        per_token_ms = self.prefill_ms_per_token
        if target_ms is None or per_token_ms is None:
            return self.max_prefill_tokens  # learning: the first chunk beside decodes measures the cost
        decode_part_ms = (self.decode_ms or 0.0) if decodes_ride_along else 0.0
        room_ms = max(target_ms - decode_part_ms, 0.0)
        per_token_ms = max(per_token_ms, 1e-6)
        budget = int(room_ms / per_token_ms)
        self.last_budget_tokens = min(max(budget, MIN_CHUNK_TOKENS), self.max_prefill_tokens)
        return self.last_budget_tokens


def _ewma(previous: float | None, value: float) -> float:
    return value if previous is None else (1 - EWMA_WEIGHT) * previous + EWMA_WEIGHT * value
