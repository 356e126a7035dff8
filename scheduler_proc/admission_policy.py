"""AdmissionPolicy: the order in which queued requests are offered to the PrefillAdder.

- fifo: in arrival order, stopping at the first request that is not admitted; nobody overtakes.
- pack: look ahead `lookahead` requests and offer them smallest prompt first (stable among
  equals), skipping those that do not fit, so the budget fills with what fits. Every
  `force_fifo_every`-th admission step is fifo, so a long prompt at the head cannot starve.

Under either, retracted requests (back at the head of the queue) are offered first, in order,
and nobody overtakes them: they were admitted before anything still waiting.
"""

from __future__ import annotations

import itertools
from collections import deque

from zserve.common.scheduler_choices import ADMISSION_POLICIES
from zserve.scheduler_proc.prefill_adder import AddOutcome, PrefillAdder
from zserve.scheduler_proc.req import PendingReq


class AdmissionPolicy:
    def __init__(self, name: str, lookahead: int, force_fifo_every: int):
        if name not in ADMISSION_POLICIES:
            raise ValueError(f"admission policy must be one of {ADMISSION_POLICIES}, got {name!r}")
        if lookahead < 1 or force_fifo_every < 1:
            raise ValueError(
                f"admission_lookahead and force_fifo_every must be >= 1, got {lookahead}, {force_fifo_every}"
            )
        self.name = name
        self.lookahead = lookahead
        self.force_fifo_every = force_fifo_every
        self._num_steps = 0  # admission steps so far (steps with budget and a queue)

    def admit(self, adder: PrefillAdder, queue: deque[PendingReq]) -> None:
        """Offer queued requests to `adder`; admitted ones leave the queue."""
        if not queue or adder.token_budget <= 0:
            return
        self._num_steps += 1
        while queue and queue[0].is_retracted:
            if adder.try_add(queue[0]) is not AddOutcome.ADMITTED:
                return
            queue.popleft()
        if self.name == "fifo" or self._num_steps % self.force_fifo_every == 0:
            self._admit_fifo(adder, queue)
        else:
            self._admit_pack(adder, queue)

    def _admit_fifo(self, adder: PrefillAdder, queue: deque[PendingReq]) -> None:
        while queue and adder.try_add(queue[0]) is AddOutcome.ADMITTED:
            queue.popleft()

    def _admit_pack(self, adder: PrefillAdder, queue: deque[PendingReq]) -> None:
        window = list(itertools.islice(queue, self.lookahead))
        order = sorted(range(len(window)), key=lambda i: window[i].num_prompt_tokens)  # stable
        admitted = set()
        for i in order:
            outcome = adder.try_add(window[i])
            if outcome is AddOutcome.ADMITTED:
                admitted.add(i)
            elif outcome in (AddOutcome.REQUEST_CAP, AddOutcome.NO_ROW):
                break  # nobody else can get in this step
            # NO_BUDGET: a prompt identical to one computed this step still can (sharing its K/V costs no budget)
        if admitted:
            for _ in window:
                queue.popleft()
            queue.extendleft(reversed([p for i, p in enumerate(window) if i not in admitted]))
