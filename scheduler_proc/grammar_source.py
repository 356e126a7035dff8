"""GrammarSource: what the scheduler core asks of structured output, one grammar per constrained request.

    start(req_id, spec)     submit: begin building the grammar (compiling may run in the background)
    is_ready / failure      each poll, while the request waits for it in the PendingList
    fill_bitmask            each step the request is sampled in: the tokens it allows next
    accept / is_terminated  each token the request samples, in order
    release                 the request ended (finish, abort, failure); a retraction keeps it

The core owns the lifecycle (ConstrainedReqs); a source only answers. The real one is xgrammar
(xgrammar_source.py); tests use testing/fake_grammar.py, so the core runs constrained requests
with no xgrammar.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from zserve.common.error_code import ErrorCode


class GrammarSource(Protocol):
    vocab_size: int  # a bitmask row has ceil(vocab_size / 32) int32 words: bit j of word w allows token 32 w + j

    def start(self, req_id: int, spec: tuple[str, str]) -> None:
        """Build the grammar of `spec` ((kind, text), SamplingParams.grammar) for `req_id`."""

    def is_ready(self, req_id: int) -> bool:
        """Built: `req_id` may be admitted, its grammar at its start (or where its output left it)."""

    def failure(self, req_id: int) -> tuple[ErrorCode, str] | None:
        """Why the grammar cannot be built (INVALID: the spec's fault), once that is known; else None."""

    def fill_bitmask(self, req_id: int, bitmask: np.ndarray, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (int32[m, words per row])."""

    def accept(self, req_id: int, token_id: int) -> None:
        """Advance past the token the request sampled."""

    def is_terminated(self, req_id: int) -> bool:
        """The grammar accepted its stop token: it takes no more."""

    def release(self, req_id: int) -> None:
        """Forget `req_id`'s grammar (nothing happens for an id it does not hold)."""

    def whitespace_ids(self) -> frozenset[int]:
        """The tokens that are whitespace only (asked once a grammar is built): the lead an answer may
        write between a marker and its grammar (SamplingParams.grammar_after, ConstrainedReqs)."""

    def held_req_ids(self) -> set[int]:
        """Every req_id it holds a grammar (built or building) for: the core's integrity check."""
