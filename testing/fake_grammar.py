"""FakeGrammarSource: a GrammarSource with no xgrammar, so the scheduler core's tests run
constrained (structured-output) requests.

A request's spec text (e.g. `SamplingParams(regex="digits")`) names a FakeGrammar the test
registered: it allows only `allowed_ids` for its first `num_tokens` tokens, then only the stop ids
(its end: accepting one terminates it). It is built after `build_polls` polls, or fails then with
`error`. What it allows is a function of the output length alone, so the harness predicts every
token: `masked_token(the FakeModel's token, allowed)`, which is what `apply_grammar_masks` (the
fake sampler) picks. It checks the core's side of the contract: a token it does not allow, or any
token after its end, or a call for a request it does not hold, fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zserve.common.error_code import ErrorCode
from zserve.common.forward_batch import GrammarMasks, StepResult


@dataclass(frozen=True)
class FakeGrammar:
    allowed_ids: frozenset[int]
    num_tokens: int = 3  # tokens before its end; then only the stop ids
    build_polls: int = 0  # is_ready answers False this many times first
    error: str | None = None  # fails to build, with this message (INVALID)


@dataclass
class FakeGrammarSource:
    grammars: dict[str, FakeGrammar]  # by spec text
    stop_ids: frozenset[int]
    vocab_size: int
    released: list[int] = field(default_factory=list)  # req_ids, in the order released
    whitespace: frozenset[int] = frozenset()  # whitespace_ids(): what may come between a marker and the grammar
    _grammar: dict[int, FakeGrammar] = field(default_factory=dict)  # req_id -> its grammar, built or not
    _num_polls: dict[int, int] = field(default_factory=dict)
    _num_accepted: dict[int, int] = field(default_factory=dict)  # built ones
    _terminated: set[int] = field(default_factory=set)

    def allowed(self, spec: tuple[str, str], num_output_tokens: int) -> frozenset[int]:
        """What the grammar of `spec` allows after `num_output_tokens` tokens."""
        grammar = self.grammars[spec[1]]
        return grammar.allowed_ids if num_output_tokens < grammar.num_tokens else self.stop_ids

    # -- GrammarSource ----------------------------------------------------------------------------

    def start(self, req_id: int, spec: tuple[str, str]) -> None:
        assert req_id not in self._grammar, f"req {req_id}: a second grammar started"
        self._grammar[req_id] = self.grammars[spec[1]]
        self._num_polls[req_id] = 0

    def is_ready(self, req_id: int) -> bool:
        if req_id in self._num_accepted:
            return True
        grammar = self._grammar[req_id]
        self._num_polls[req_id] += 1
        if grammar.error is None and self._num_polls[req_id] > grammar.build_polls:
            self._num_accepted[req_id] = 0
            return True
        return False

    def failure(self, req_id: int) -> tuple[ErrorCode, str] | None:
        grammar = self._grammar[req_id]
        if grammar.error is not None and self._num_polls[req_id] > grammar.build_polls:
            return ErrorCode.INVALID, grammar.error
        return None

    def fill_bitmask(self, req_id: int, bitmask: np.ndarray, row: int) -> None:
        words = np.zeros(bitmask.shape[1], np.uint32)
        for token_id in self._allowed_now(req_id):
            words[token_id // 32] |= np.uint32(1 << (token_id % 32))
        bitmask[row] = words.view(np.int32)

    def accept(self, req_id: int, token_id: int) -> None:
        allowed = self._allowed_now(req_id)
        assert req_id not in self._terminated, f"req {req_id}: token {token_id} given to a terminated grammar"
        assert token_id in allowed, f"req {req_id}: token {token_id} given to a grammar allowing {sorted(allowed)}"
        if token_id in self.stop_ids and self._num_accepted[req_id] >= self._grammar[req_id].num_tokens:
            self._terminated.add(req_id)
        self._num_accepted[req_id] += 1

    def is_terminated(self, req_id: int) -> bool:
        assert req_id in self._num_accepted, f"req {req_id}: asked before its grammar is built"
        return req_id in self._terminated

    def release(self, req_id: int) -> None:
        assert req_id in self._grammar, f"req {req_id}: released twice, or never started"
        for table in (self._grammar, self._num_polls, self._num_accepted):
            table.pop(req_id, None)
        self._terminated.discard(req_id)
        self.released.append(req_id)

    def held_req_ids(self) -> set[int]:
        return set(self._grammar)

    def whitespace_ids(self) -> frozenset[int]:
        return self.whitespace

    def _allowed_now(self, req_id: int) -> frozenset[int]:
        assert req_id in self._num_accepted, f"req {req_id}: its grammar is not built"
        grammar = self._grammar[req_id]
        return grammar.allowed_ids if self._num_accepted[req_id] < grammar.num_tokens else self.stop_ids


def grammar_view(
    marker_ids: tuple[int, ...], output_ids: list[int], whitespace: frozenset[int], max_lead: int,
) -> tuple[list[int], bool] | None:
    """What ConstrainedReqs shows a grammar of `output_ids`: None while a marker
    (SamplingParams.grammar_after) has not ended them (the next token is free); else (the tokens
    the grammar has seen, whether a whitespace token may come next too): after the marker's first
    end, up to `max_lead` whitespace tokens are its lead, which the grammar does not see."""
    if not marker_ids:
        return output_ids, False
    n = len(marker_ids)
    after = next((output_ids[end:] for end in range(n, len(output_ids) + 1)
                  if tuple(output_ids[end - n : end]) == marker_ids), None)
    if after is None:
        return None
    lead = 0
    while lead < min(len(after), max_lead) and after[lead] in whitespace:
        lead += 1
    return after[lead:], lead == len(after) and lead < max_lead


def masked_token(token_id: int, allowed: frozenset[int]) -> int:
    """The fake sampler under a mask: the model's token if allowed, else the next allowed id (cyclically)."""
    if token_id in allowed:
        return token_id
    return min((t for t in allowed if t > token_id), default=min(allowed))


def apply_grammar_masks(result: StepResult, masks: GrammarMasks) -> None:
    """What the sampler does with the ForwardBatch's masks (it gives disallowed tokens -inf),
    on the FakeModel's result, in place."""
    words = masks.bitmask.reshape(-1, masks.words_per_row).view(np.uint32)
    for row, row_words in zip(masks.rows.tolist(), words, strict=True):
        allowed = frozenset(np.flatnonzero(np.unpackbits(row_words.view(np.uint8), bitorder="little")).tolist())
        result.next_token_ids[row] = masked_token(int(result.next_token_ids[row]), allowed)
