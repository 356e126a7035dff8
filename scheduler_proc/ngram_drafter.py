"""NgramDrafter: speculative-decoding drafts from n-gram matches in a request's own prompt + output
(prompt lookup: vLLM's `ngram` method, SGLang's `--speculative-algorithm NGRAM`).

Matching. For a request whose sequence (prompt, then output) is s[0 .. L-1], for n from the
largest window down to the smallest: the most recent j < L - n with s[j : j+n] == s[L-n : L];
the drafts are what followed it, s[j+n : j+n+K] (K = --speculative-num-draft-tokens; fewer when
the sequence ends first). The first n that matches wins; no match: no drafts.

    s      a b c d x a b c d y a b c          last 3 = "a b c", most recent earlier one at j = 5
    drafts             d y a b                (K = 4; the match may run into the suffix itself)

A match close to the end runs into the suffix itself; the drafts then go on copying from where
they started, as a periodic stream would (s[L+i] = s[j+n+i], drafts included), so a short period
still gives K drafts:

    s      ... x y x y x y                    last 3 = "y x y" at j = L - 5: drafts x y x y (K = 4)

Index. Per request and window n, a dict from each n-gram that has a next token (j + n <= L - 1),
its token ids packed in one int (exact: no collisions), to its latest start j; built with numpy
on the request's first lookup (its prompt: ~0.1 us a token and window, once) and then updated with
the step's new tokens only: a lookup is one dict get per window, and a step costs
O(new tokens x windows), never O(L). A request with a token id past 2**21 is not drafted.

Back-off (per request). Each drafted step's (drafts, accepted) goes into a window of the last
BACKOFF_WINDOW drafted steps; once the window is full and accepted / drafted < MIN_ACCEPT_RATE,
the request stops drafting for `backoff` of its decode steps (no lookup either), the window
clears, and `backoff` doubles (BACKOFF_MIN_STEPS .. BACKOFF_MAX_STEPS); a full window at or above
the rate resets it. A stream the drafts do not predict thus costs a few rejected drafts at
geometrically growing intervals, ~nothing. After MISS_STEPS lookups in a row that found no match,
the request skips as many steps without looking (its index catches up on the next lookup), so a
stream with nothing to copy from costs little scheduler time either.

Who gets drafts: a decoding request asking for no logprobs or top logprobs, no penalties, logit
bias or min_tokens, and no grammar (the worker's verification does not apply those: see
ForwardBatch's Drafts), greedy or sampled. SpeculativeReqs (speculation.py) decides how many of
the drafts a row can take (max_tokens, its pages, the per-step cap); this file only finds them and
keeps the back-off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from zserve.scheduler_proc.req import Req

BACKOFF_WINDOW = 4  # drafted steps judged together
MIN_ACCEPT_RATE = 0.25  # accepted / drafted below this over the window: back off
BACKOFF_MIN_STEPS = 8
BACKOFF_MAX_STEPS = 512
MISS_STEPS = 8  # lookups in a row that found nothing: then as many steps without lookups
TOKEN_BITS = 21  # an n-gram's key packs its token ids exactly (every vocabulary is below 2**21 ids)


@dataclass(slots=True, eq=False)
class DraftState:
    """One request's index and back-off; the NgramDrafter owns it."""

    eligible: bool
    tokens: list[int] = field(default_factory=list)  # its sequence as far as seen
    num_indexed: int = 0  # the n-grams ending before this position are in the index
    index: list[dict[int, int]] = field(default_factory=list)  # per window n = 1..max: key -> latest start
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=BACKOFF_WINDOW))  # (drafted, accepted)
    skip_steps: int = 0  # decode steps left without drafting
    num_misses: int = 0  # lookups in a row that found nothing
    backoff_steps: int = BACKOFF_MIN_STEPS  # the next pause
    accept_rate: float = 1.0  # acceptance over the recent window (1 before any: new requests go first)


def _gram_keys(tokens: np.ndarray, n: int, count: int) -> list[int]:
    """The key of tokens[j : j+n] for j < count: the tokens packed TOKEN_BITS each, first highest."""
    if n * TOKEN_BITS <= 63:
        keys = np.zeros(count, np.int64)
        for i in range(n):
            keys = (keys << TOKEN_BITS) | tokens[i : i + count]
        return keys.tolist()
    out = []
    for j in range(count):  # windows past 3 tokens: Python ints (exact, slower; only with a large max window)
        key = 0
        for t in tokens[j : j + n].tolist():
            key = (key << TOKEN_BITS) | t
        out.append(key)
    return out


class NgramDrafter:
    def __init__(self, num_draft_tokens: int, min_window: int, max_window: int, miss_steps: int = MISS_STEPS):
        if num_draft_tokens < 1:
            raise ValueError(f"speculative num draft tokens must be >= 1, got {num_draft_tokens}")
        if not 1 <= min_window <= max_window:
            raise ValueError(f"n-gram windows must be 1 <= min <= max, got {min_window}..{max_window}")
        self.num_draft_tokens = num_draft_tokens
        self.min_window = min_window
        self.max_window = max_window
        self.miss_steps = miss_steps  # 0: look up every step, whatever was found before
        self._states: dict[int, DraftState] = {}  # req_id -> state, while the request is live

    def __len__(self) -> int:
        return len(self._states)

    @property
    def req_ids(self) -> set[int]:
        return set(self._states)

    def release(self, req_id: int) -> None:
        """The request has ended: drop its index."""
        self._states.pop(req_id, None)

    def propose(self, req: Req, max_drafts: int) -> list[int]:
        """Up to min(K, max_drafts) draft tokens to follow `req`'s sequence; [] when it takes none
        (not eligible, backing off, nothing matches)."""
        state = self._states.get(req.req_id)
        if state is None:
            state = self._states[req.req_id] = self._new_state(req)
        if not state.eligible or max_drafts <= 0:
            return []
        if state.skip_steps > 0:
            state.skip_steps -= 1
            return []
        tokens = state.tokens
        if len(tokens) < req.seq_len:  # the step's new tokens
            tokens.extend(req.output_ids[len(tokens) - req.num_orig_prompt_tokens :])
        length = len(tokens)
        index, bits, max_window = state.index, TOKEN_BITS, self.max_window
        for p in range(state.num_indexed, length - 1):  # n-grams ending at p now have a next token
            key = 0
            for n in range(1, min(max_window, p + 1) + 1):
                key |= tokens[p - n + 1] << (bits * (n - 1))
                index[n - 1][key] = p - n + 1
        state.num_indexed = max(state.num_indexed, length - 1)
        keys = []  # the suffix's keys, window 1 up
        key = 0
        for n in range(1, min(max_window, length - 1) + 1):
            key |= tokens[length - n] << (bits * (n - 1))
            keys.append(key)
        for n in range(len(keys), self.min_window - 1, -1):
            j = index[n - 1].get(keys[n - 1])
            if j is not None:
                k = min(self.num_draft_tokens, max_drafts)
                start = j + n
                drafts = tokens[start : start + k]
                while len(drafts) < k:  # the match runs into the suffix: go on copying (periodic)
                    drafts.append(drafts[len(drafts) - (length - start)])
                state.num_misses = 0
                return drafts
        state.num_misses += 1
        # nothing to copy from lately: look again later (indexing catches up then)
        if state.num_misses == self.miss_steps:
            state.num_misses = 0
            state.skip_steps = self.miss_steps
        return []

    def _new_state(self, req: Req) -> DraftState:
        p = req.params
        eligible = not (p.return_logprob or p.top_logprobs or p.has_penalties or p.grammar is not None)
        state = DraftState(eligible, index=[{} for _ in range(self.max_window)])
        if not eligible:
            return state
        num_orig = req.num_orig_prompt_tokens
        arr = req.input_ids[:num_orig].astype(np.int64)
        if req.output_ids:  # after a retraction
            arr = np.concatenate([arr, np.asarray(req.output_ids, np.int64)])
        if arr.size and (arr.min() < 0 or arr.max() >= 1 << TOKEN_BITS):
            state.eligible = False
            return state
        state.tokens = arr.tolist()
        end = len(arr) - 1  # n-grams ending before the last token have a next token
        for n, table in enumerate(state.index, start=1):
            count = end - n + 1  # starts j with j + n <= end
            if count > 0:
                table.update(zip(_gram_keys(arr, n, count), range(count), strict=True))  # later starts win
        state.num_indexed = max(end, 0)
        return state

    def accept_rate(self, req_id: int) -> float:
        return self._states[req_id].accept_rate

    def on_verified(self, req_id: int, num_drafted: int, num_accepted: int) -> None:
        """The worker accepted `num_accepted` of the request's `num_drafted` drafts (num_drafted > 0)."""
        state = self._states.get(req_id)
        if state is None:
            return
        state.recent.append((num_drafted, num_accepted))
        drafted = sum(d for d, _ in state.recent)
        state.accept_rate = sum(a for _, a in state.recent) / drafted
        if len(state.recent) < BACKOFF_WINDOW:
            return
        if state.accept_rate < MIN_ACCEPT_RATE:
            state.skip_steps = state.backoff_steps
            state.backoff_steps = min(BACKOFF_MAX_STEPS, 2 * state.backoff_steps)
            state.recent.clear()
        else:
            state.backoff_steps = BACKOFF_MIN_STEPS

    def is_backing_off(self, req_id: int) -> bool:
        state = self._states.get(req_id)
        return state is not None and state.skip_steps > 0
