"""ConstrainedReqs: which live requests are under a grammar (structured output), and the
GrammarSource calls of their lifecycle, made by the scheduler core alone:

    submit    refusal: structured output is off (no source); else start the request's grammar
    waiting   is_ready / failure: the PendingList holds the request back until its grammar is built
    step      masks: for the sampled requests under a grammar, the tokens each allows next
    result    accept: each sampled token, in order (none once the grammar has terminated)
    end       release: finish, abort, or a grammar that failed to build

A request with `grammar_after` (a reasoning model's `</think>` ids) thinks free first, as vLLM's
do: no mask and no accept until its output ends with that marker; from the token after it on,
mask and accept as usual. Which side of the marker it is on is read off its output ids at each
token (MarkerWait), so nothing about it is counted that a retraction could break. Right after the
marker the answer may first write up to MAX_LEAD_WHITESPACE_TOKENS whitespace-only tokens which the
grammar does not see (Qwen3 writes "\n\n" after `</think>`; a JSON grammar starts at `{`): its
mask then allows them too; the first other token, or the bound, starts the grammar.

A retracted request keeps its grammar where its output left it: its output is still its output,
and its re-admission samples the next token of that same output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from zserve.common.error_code import ErrorCode
from zserve.common.forward_batch import GrammarMasks
from zserve.common.int_math import cdiv
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.grammar_source import GrammarSource
from zserve.scheduler_proc.req import PendingReq, Req

GRAMMAR_OFF = "structured output is off on this server (--grammar-backend none)"
MAX_LEAD_WHITESPACE_TOKENS = 2  # between a marker and the grammar; bounded, so the lead cannot run on


@dataclass(frozen=True, slots=True)
class MarkerWait:
    """A grammar that starts after its request's output has ended with `marker_ids`."""

    marker_ids: tuple[int, ...]

    def ended_by(self, output_ids: Sequence[int]) -> bool:
        n = len(self.marker_ids)
        return len(output_ids) >= n and tuple(output_ids[-n:]) == self.marker_ids


class ConstrainedReqs:
    def __init__(self, source: GrammarSource | None):
        self.source = source  # None: structured output is off, constrained requests are refused
        self._req_ids: set[int] = set()  # live requests under a grammar, waiting or admitted
        self._waits: dict[int, MarkerWait] = {}  # those of them whose grammar has not started: still thinking
        # past their marker with only whitespace since: req_id -> its output length when the marker ended it
        self._leads: dict[int, int] = {}
        self._whitespace_row: np.ndarray | None = None

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._req_ids

    def __len__(self) -> int:
        return len(self._req_ids)

    def refusal(self, params: SamplingParams) -> str | None:
        return GRAMMAR_OFF if params.grammar is not None and self.source is None else None

    def start(self, req_id: int, params: SamplingParams) -> None:
        """Start building `req_id`'s grammar, if it asked for one."""
        spec = params.grammar
        if spec is not None:
            self.source.start(req_id, spec)
            self._req_ids.add(req_id)
            if params.grammar_after:
                self._waits[req_id] = MarkerWait(tuple(params.grammar_after))

    def is_ready(self, req_id: int) -> bool:
        return self.source.is_ready(req_id)

    def failure(self, req_id: int) -> tuple[ErrorCode, str] | None:
        return self.source.failure(req_id)

    def masks(self, sampled_req_ids: list[int | None]) -> GrammarMasks | None:
        """The allowed-token bitmask of each sampled request under a grammar; None when none is.
        `sampled_req_ids` has one entry per batch row (None: not sampled this step), and
        GrammarMasks.rows index it: they are batch rows."""
        if not self._req_ids:
            return None
        rows = [
            i for i, req_id in enumerate(sampled_req_ids) if req_id in self._req_ids and req_id not in self._waits
        ]
        if not rows:
            return None
        words_per_row = cdiv(self.source.vocab_size, 32)
        bitmask = np.zeros((len(rows), words_per_row), np.int32)
        for row, i in enumerate(rows):
            self.source.fill_bitmask(sampled_req_ids[i], bitmask, row)
            if sampled_req_ids[i] in self._leads:
                bitmask[row] |= self._whitespace_words(words_per_row)
        return GrammarMasks(rows=np.array(rows, np.int32), words_per_row=words_per_row, bitmask=bitmask.reshape(-1))

    def _whitespace_words(self, words_per_row: int) -> np.ndarray:
        """The bitmask row allowing the source's whitespace-only tokens (made once)."""
        if self._whitespace_row is None:
            words = np.zeros(words_per_row, np.uint32)
            for token_id in self.source.whitespace_ids():
                words[token_id // 32] |= np.uint32(1 << (token_id % 32))
            self._whitespace_row = words.view(np.int32)
        return self._whitespace_row

    def accept(self, req_id: int, output_ids: Sequence[int]) -> None:
        """`req_id` sampled the last of its `output_ids` (a no-op for a free request: the hot path
        asks for every token). Before its marker has ended the output, the token is the thinking's:
        the grammar does not see it (nor the marker's own tokens)."""
        if req_id not in self._req_ids:
            return
        wait = self._waits.get(req_id)
        if wait is not None:
            if wait.ended_by(output_ids):
                del self._waits[req_id]  # the grammar starts with the next token, or after whitespace
                self._leads[req_id] = len(output_ids)
            return
        lead_start = self._leads.get(req_id)
        if lead_start is not None:
            if output_ids[-1] in self.source.whitespace_ids():
                if len(output_ids) - lead_start >= MAX_LEAD_WHITESPACE_TOKENS:
                    del self._leads[req_id]
                return
            del self._leads[req_id]
        if not self.source.is_terminated(req_id):
            self.source.accept(req_id, output_ids[-1])

    def release(self, req_id: int) -> None:
        """`req_id` ended: its grammar goes (a no-op for a free request)."""
        if req_id in self._req_ids:
            self._req_ids.remove(req_id)
            self._waits.pop(req_id, None)
            self._leads.pop(req_id, None)
            self.source.release(req_id)

    def check_integrity(self, live: Mapping[int, PendingReq | Req]) -> None:
        """Every live request under a grammar is known here, and its grammar is held; no other is."""
        live_constrained = {req_id for req_id, entry in live.items() if entry.params.grammar is not None}
        assert live_constrained == self._req_ids, (
            f"live constrained requests {sorted(live_constrained)}, grammars started for {sorted(self._req_ids)}"
        )
        assert self._waits.keys() <= self._req_ids, f"marker waits {sorted(self._waits)} outlive their requests"
        assert self._leads.keys() <= self._req_ids - self._waits.keys(), f"leads {sorted(self._leads)}"
        if self.source is not None:
            held = self.source.held_req_ids()
            assert held == self._req_ids, (
                f"grammars held for {sorted(held - self._req_ids)} leaked, for {sorted(self._req_ids - held)} lost"
            )
