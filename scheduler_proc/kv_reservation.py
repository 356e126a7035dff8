"""KvReservation: how many KV pages stay promised to each admitted request (`reserved_size`).

A request may still write its uncomputed prompt and then up to its remaining max_tokens:

    KV tokens  [ cached (in the pool) | prompt left | output left                          ]
               0                 cached_len    prompt end                  prompt + max_tokens - 1

- `full` (mini-sglang's rule): all of it is reserved. Admission never over-commits, so a decode
  step always gets its pages and no request is ever retracted. A chat without max_tokens
  reserves the whole context, so few run at once.
- `estimated` (SGLang's refinement): the prompt left exactly (a ChunkedReq's next chunk must
  always find its pages), plus `min(output left, CLIP_TOKENS) * new_token_ratio` of the output.
  Most requests stop (EOS) long before max_tokens, so many more run at once; when the estimate
  proves short, a decode step cannot get a page for every running request and the scheduler
  retracts some (see Scheduler).

`new_token_ratio` starts at `INIT_RATIO * conservativeness`, falls linearly each decode step to
`MIN_RATIO * conservativeness` over DECAY_STEPS steps (estimates may loosen while nothing goes
wrong), goes back to its start when nothing runs, and after a step with retractions jumps back to
its start, or, when it is already at or above its start (the estimate keeps proving short),
halfway to 1 (the `full` reservation, clipped). SGLang's defaults: 0.7, 0.1 (~0.098), 600 steps,
4096 tokens.

Speculative drafts (SpeculativeReqs) need no reservation of their own: a request's drafts stop at
max_tokens - 1 output tokens, so its K/V never passes `num_kv_tokens`, the end of its `full`
reservation (and of its page table). Their pages are taken only when free or evictable (a request
keeps fewer drafts rather than retract anyone) and those of rejected drafts are freed after the
step, so `check_pages` holds as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from zserve.common.int_math import cdiv
from zserve.common.scheduler_choices import KV_RESERVATIONS
from zserve.scheduler_proc.req import Req

INIT_RATIO = 0.7
MIN_RATIO = 0.1
DECAY_STEPS = 600
CLIP_TOKENS = 4096  # an output estimate never counts more than this many tokens


class KvReservation:
    def __init__(self, mode: str, page_size: int, conservativeness: float = 1.0):
        if mode not in KV_RESERVATIONS:
            raise ValueError(f"kv reservation must be one of {KV_RESERVATIONS}, got {mode!r}")
        if not conservativeness > 0:
            raise ValueError(f"schedule conservativeness must be > 0, got {conservativeness}")
        self.mode = mode
        self.page_size = page_size
        self.init_ratio = min(1.0, INIT_RATIO * conservativeness)
        self.min_ratio = min(self.init_ratio, MIN_RATIO * conservativeness)
        self.decay_per_step = (self.init_ratio - self.min_ratio) / DECAY_STEPS
        self.new_token_ratio = self.init_ratio

    @property
    def is_full(self) -> bool:
        return self.mode == "full"

    def num_pages(self, *, num_prompt_tokens: int, num_kv_tokens: int, cached_len: int, num_pages: int) -> int:
        """Pages to keep promised to a request beyond the `num_pages` it holds: it has `cached_len`
        tokens in KV and may write up to `num_kv_tokens` in all, the first `num_prompt_tokens` of
        them prompt. Never more than the `full` reservation."""
        end = self._end(max(cached_len, num_prompt_tokens), num_kv_tokens)
        return max(0, cdiv(end, self.page_size) - num_pages)

    def num_reserved_pages(self, reqs: Iterable[Req]) -> int:
        """`num_pages` summed over admitted requests (inlined: it runs every step)."""
        if self.is_full:
            return sum(len(r.page_table) - r.num_pages for r in reqs)  # the page table holds all it may write
        ps, ratio = self.page_size, self.new_token_ratio
        total = 0
        for r in reqs:
            prompt_end = r.cached_len if r.cached_len > r.num_prompt_tokens else r.num_prompt_tokens
            output_left = r.num_orig_prompt_tokens + r.max_tokens - 1 - prompt_end
            end = prompt_end + math.ceil((output_left if output_left < CLIP_TOKENS else CLIP_TOKENS) * ratio)
            total += max(0, -(-end // ps) - r.num_pages)  # cdiv(end, ps), inlined
        return total

    def _end(self, prompt_end: int, kv_end: int) -> int:
        """Where the reserved KV ends: everything under `full`; the prompt and the estimated
        share of the output under `estimated`."""
        if self.is_full:
            return kv_end
        return prompt_end + math.ceil(min(kv_end - prompt_end, CLIP_TOKENS) * self.new_token_ratio)

    def on_decode_step(self) -> None:
        self.new_token_ratio = max(self.min_ratio, self.new_token_ratio - self.decay_per_step)

    def on_retracted(self) -> None:
        """A decode step had to retract: the estimate was too low."""
        assert not self.is_full, "retraction under the full reservation: admission over-committed"
        if self.new_token_ratio < self.init_ratio:
            self.new_token_ratio = self.init_ratio
        else:
            self.new_token_ratio = (self.new_token_ratio + 1.0) / 2

    def on_idle(self) -> None:
        """Nothing runs: the next requests start from the conservative ratio again."""
        self.new_token_ratio = self.init_ratio
