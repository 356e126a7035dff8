"""SchedulerHarness: drives a Scheduler against a FakeModel and checks what a client would see.

For tests and benchmarks only. After every call it checks:
  - every sampled token equals `model.true_next_token(prompt + output so far)`, so a request that
    read a freed, reused or foreign page is caught (freed pages are also poisoned, and so are the
    slots of rejected speculative drafts); for a request under a grammar (a FakeGrammarSource's),
    that token under the grammar's mask;
  - one update per request per step (several tokens in it only for a row with drafts), a finish
    reason exactly when one is due (with the update's last token), nothing after it;
  - `Scheduler.check_integrity()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np

from testing.fake_grammar import FakeGrammarSource, apply_grammar_masks, grammar_view, masked_token
from testing.fake_model import FakeModel
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch
from zserve.common.messages import TokenOut
from zserve.common.pooling import Pooling
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_choices import overlap_schedule_for
from zserve.common.server_config import ServerConfig
from zserve.model_proc.future_tokens import FutureTokens
from zserve.scheduler_proc.constrained_reqs import MAX_LEAD_WHITESPACE_TOKENS
from zserve.scheduler_proc.grammar_source import GrammarSource
from zserve.scheduler_proc.scheduler import Scheduler
from zserve.scheduler_proc.scheduler_knobs import SPECULATIVE_KNOBS, scheduler_knobs


def make_scheduler(
    *, num_pages: int, page_size: int, context_len: int, eos_token_ids: Sequence[int],
    on_pages_freed: Callable[[np.ndarray], None] | None = None, grammar_source: GrammarSource | None = None,
    pooling: Pooling | None = None, **knobs: Any,
) -> Scheduler:
    """A Scheduler with the server's default policy knobs (`ServerConfig()`), except those named
    (by their flat names: `speculative_num_draft_tokens=4`, see SPECULATIVE_KNOBS)."""
    defaults = scheduler_knobs(ServerConfig())
    unknown = set(knobs) - {f.name for f in fields(defaults)} - set(SPECULATIVE_KNOBS)
    if unknown:
        raise TypeError(f"not a scheduler knob: {', '.join(sorted(unknown))}")
    speculative = replace(
        knobs.pop("speculative", defaults.speculative),
        **{SPECULATIVE_KNOBS[name]: knobs.pop(name) for name in set(knobs) & set(SPECULATIVE_KNOBS)},
    )
    knobs = replace(defaults, speculative=speculative, **knobs)
    # auto as the server resolves it for a worker on the CPU
    knobs = replace(knobs, overlap_schedule=overlap_schedule_for(knobs.overlap_schedule, "cpu"))
    return Scheduler(
        num_pages=num_pages, page_size=page_size, context_len=context_len, eos_token_ids=eos_token_ids,
        knobs=knobs,
        on_pages_freed=on_pages_freed, grammar_source=grammar_source, pooling=pooling,
    )


class SchedulerHarness:
    """Builds its Scheduler over `model`'s pool (server defaults, except the knobs named) and poisons
    every page the scheduler frees, through the CacheManager's `on_pages_freed` hook. With a
    `grammar_source`, constrained requests are sampled under their masks (apply_grammar_masks)."""

    def __init__(
        self, model: FakeModel, *, context_len: int, eos_token_ids: Sequence[int], check_integrity: bool = True,
        grammar_source: FakeGrammarSource | None = None, step_ms: Callable[[ForwardBatch], float] | None = None,
        **knobs: Any,
    ):
        """`step_ms`: what the fake worker reports each step took (StepResult.forward_ms, as the process loop records
        it through Scheduler.record_step_time); None records nothing, as the scheduler tests before it."""
        self.model = model
        self.step_ms = step_ms
        # one step at a time unless a test asks for overlap: most scheduler tests follow a request step by step
        knobs.setdefault("overlap_schedule", "off")
        self.grammar_source = grammar_source
        self.scheduler = make_scheduler(
            num_pages=model.num_pages, page_size=model.page_size, context_len=context_len, eos_token_ids=eos_token_ids,
            on_pages_freed=model.poison, grammar_source=grammar_source, **knobs,
        )
        self.check = check_integrity
        self.prompts: dict[int, list[int]] = {}
        self.params: dict[int, SamplingParams] = {}
        self.outputs: dict[int, list[int]] = {}
        self.final: dict[int, TokenOut] = {}  # req_id -> its update with finish_reason
        self.first: dict[int, TokenOut] = {}
        self.batches: list[ForwardBatch] = []  # every batch sent, as the scheduler built it
        self._sent: deque[ForwardBatch] = deque()  # with the fake worker, oldest first
        self._future = FutureTokens()

    def submit(self, req_id: int, prompt: Sequence[int], params: SamplingParams | None = None, num_copies: int = 1) -> list[TokenOut]:
        """Submit a request (n copies of it: req_ids req_id .. req_id + num_copies - 1)."""
        params = params or SamplingParams()
        for copy_id in range(req_id, req_id + num_copies):
            assert copy_id not in self.prompts, f"the harness needs unique req_ids ({copy_id})"
            self.prompts[copy_id], self.params[copy_id], self.outputs[copy_id] = list(prompt), params, []
        updates = self.scheduler.submit(req_id, prompt, params, num_copies)
        self._record(updates, expect_final=True)
        return updates

    def forget(self, req_id: int) -> None:
        """`req_id` had its final update: its client may give the id again (submit checks the new request's tokens
        on their own)."""
        assert req_id in self.final, f"request {req_id} has not ended"
        for record in (self.prompts, self.params, self.outputs, self.final, self.first):
            del record[req_id]

    def abort(self, req_id: int, finish_reason: FinishReason = FinishReason.ABORT) -> list[TokenOut]:
        updates = self.scheduler.abort(req_id, finish_reason)
        self._record(updates, expect_final=True)
        return updates

    def step(
        self, abort_in_flight: Iterable[int] = (), while_in_flight: Callable[[], object] | None = None,
    ) -> list[TokenOut] | None:
        """One turn of the process loop, after polling the grammars: send the next batch, then take
        the oldest result back; under overlap scheduling the result only when two batches are in
        flight or no batch could be sent (so a sent batch with nothing back gives []). None when
        there was nothing to run. `abort_in_flight`: ids aborted while the batch is with the worker;
        `while_in_flight`: called then, after those aborts.

        The fake worker computes a batch only when its result is taken (FutureTokens fills in
        what the batch before sampled), so a page freed while a batch in flight still uses it is
        poisoned before that batch reads it."""
        self._record(self.scheduler.poll_grammars(), expect_final=True)
        batch = self.scheduler.next_batch()
        if batch is not None:
            self.batches.append(batch)
            self._sent.append(batch)
            for req_id in abort_in_flight:
                self.abort(req_id)
            if while_in_flight is not None:
                while_in_flight()
        if not self._sent:
            return None
        if batch is not None and self.scheduler.overlaps and len(self._sent) < 2:
            return []
        sent = self._sent.popleft()
        result = self.model.forward(self._future.fill(sent))
        if sent.grammar is not None:
            apply_grammar_masks(result, sent.grammar)
        self._future.remember(result)
        if self.step_ms is not None:
            self.scheduler.record_step_time(0.0, 0.0, self.step_ms(sent) / 1e3)
        updates = self.scheduler.on_result(result)
        self._record(updates)
        return updates

    def run(self, max_steps: int = 100_000) -> int:
        """Step until the scheduler has no work; returns the number of steps."""
        for num_steps in range(max_steps):
            if not self.scheduler.has_work:
                return num_steps
            if self.step() is None:  # fine while only grammars are being built (or the last one just failed)
                assert not self.scheduler.has_work or self.scheduler.waits_for_grammars_only, "the scheduler has work but built no batch"
        raise AssertionError(f"still working after {max_steps} steps")

    def assert_drained(self) -> None:
        """Everything ended exactly once; all pages are free or evictable; all rows are free."""
        s = self.scheduler
        assert not s.has_work
        assert set(self.final) == set(self.prompts), f"requests that never ended: {sorted(set(self.prompts) - set(self.final))}"
        stats = s.stats()
        assert stats.num_used_pages == 0 and stats.num_reserved_pages == 0, stats
        assert stats.num_evictable_pages == stats.num_cached_pages, stats
        assert stats.num_free_pages + stats.num_cached_pages == s._cache.num_pages, stats
        assert s._req_table.num_free_rows == s._req_table.num_rows
        assert self.grammar_source is None or not self.grammar_source.held_req_ids(), "a grammar outlived its request"
        s.check_integrity()

    def _record(self, updates: list[TokenOut], expect_final: bool = False) -> None:
        seen = set()
        for u in updates:
            assert u.req_id not in seen, f"two updates for request {u.req_id} in one call"
            seen.add(u.req_id)
            assert u.req_id not in self.final, f"update for request {u.req_id} after its final update: {u}"
            first = self.first.setdefault(u.req_id, u)
            # usage is the client's view: a retraction does not change the prefix hit reported (the
            # prompt count travels once, in DetokRegister, from the original prompt)
            assert u.num_cached_tokens == first.num_cached_tokens, f"request {u.req_id}'s reported prefix hit changed: {u}"
            if expect_final:
                assert u.finish_reason is not None and len(u.token_ids) == 0, u
            token_ids = u.token_ids.tolist()
            for k, token_id in enumerate(token_ids):
                self._check_token(u, token_id, is_last=k == len(token_ids) - 1)
            if u.finish_reason is not None:
                self.final[u.req_id] = u
        if self.check:
            self.scheduler.check_integrity()

    def _check_token(self, u: TokenOut, token_id: int, is_last: bool = True) -> None:
        prompt, output, params = self.prompts[u.req_id], self.outputs[u.req_id], self.params[u.req_id]
        expected = self.model.true_next_token(prompt + output)
        source = self.grammar_source
        view = None if params.grammar is None else grammar_view(
            params.grammar_after, output, source.whitespace, MAX_LEAD_WHITESPACE_TOKENS)
        if view is not None:
            allowed = source.allowed(params.grammar, len(view[0])) | (source.whitespace if view[1] else frozenset())
            expected = masked_token(expected, allowed)
        assert token_id == expected, f"request {u.req_id} got token {token_id} at output {len(output)}, its sequence gives {expected}"
        output.append(token_id)
        max_tokens = params.max_tokens
        if max_tokens is None:  # up to the context, or up to what the whole pool holds when that is less
            pool_tokens = self.model.num_pages * self.model.page_size
            max_tokens = min(self.scheduler.context_len - len(prompt), pool_tokens - len(prompt) + 1)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.scheduler.eos_token_ids))
        due = FinishReason.STOP if token_id in stop_ids else FinishReason.LENGTH if len(output) == max_tokens else None
        assert (u.finish_reason if is_last else None) == due, f"request {u.req_id}: finish_reason {u.finish_reason!r}, expected {due!r}"
        assert len(output) <= max_tokens
        assert (u.logprobs is not None) == params.return_logprob and (u.logprobs is None or len(u.logprobs) == len(u.token_ids)), u
