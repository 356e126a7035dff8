"""StepPolicy: what one step runs, the prefill part, the decode part, or both (`--schedule-policy`).

- prefill-first: prefill when anything can be prefilled, else decode.
- decode-first: a decode step between prefill steps while requests run.
- mixed: decode tokens and a prefill chunk share one token budget in one forward (a decoding
  row's speculative drafts, planned by SpeculativeReqs after this, take only what the prefill
  part left of it).

The parts are built by the Scheduler's callbacks (`prefill(token_budget)`: the PrefillAdder, or
None when nothing can be prefilled; `decode()`: the running requests with their pages, after any
retraction), so the policy only decides the order and the budget. While requests decode, the
prefill part's budget is also bounded in time (`--max-step-ms`, StepTimeBound: the chunk that
keeps the step near the target at the measured cost per token).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from zserve.common.scheduler_choices import STEP_POLICIES
from zserve.scheduler_proc.prefill_adder import PrefillAdder
from zserve.scheduler_proc.req import Req
from zserve.scheduler_proc.scheduled_batch import ScheduledBatch
from zserve.scheduler_proc.step_time_bound import StepTimeBound


class StepPolicy:
    def __init__(self, name: str, max_prefill_tokens: int, max_step_ms: float = math.inf):
        if name not in STEP_POLICIES:
            raise ValueError(f"schedule policy must be one of {STEP_POLICIES}, got {name!r}")
        self.name = name
        self.max_prefill_tokens = max_prefill_tokens  # the token budget of a step
        self.time_bound = StepTimeBound(max_step_ms, max_prefill_tokens)  # the prefill chunk beside decodes
        self._last_step_was_prefill = False

    def choose(
        self, num_running: int, prefill: Callable[[int], PrefillAdder | None], decode: Callable[[], list[Req]],
    ) -> tuple[list[Req], PrefillAdder | None]:
        """This step's decode requests and prefill part; both empty when nothing can run."""
        decode_reqs: list[Req] = []
        adder: PrefillAdder | None = None
        if self.name == "mixed":
            decode_reqs = decode()
            bound = self.time_bound.prefill_budget(num_running, decodes_ride_along=True)
            adder = prefill(min(self.max_prefill_tokens - len(decode_reqs), bound))
        elif self.name == "decode-first" and num_running and self._last_step_was_prefill:
            decode_reqs = decode()
        else:
            adder = prefill(self.time_bound.prefill_budget(num_running, decodes_ride_along=False))
            if adder is None:
                decode_reqs = decode()
        if adder is not None or decode_reqs:  # a step runs
            self._last_step_was_prefill = adder is not None
        return decode_reqs, adder

    def observe(self, batch: ScheduledBatch, forward_ms: float) -> None:
        """The step in flight as the worker timed it: the decode and prefill costs the time bound learns."""
        self.time_bound.observe(batch.num_prefilled_tokens, len(batch.decode_reqs), forward_ms)
