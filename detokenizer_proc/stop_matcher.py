"""Stop strings on a stream of text: hold back what may be the start of one, cut before a match.

Text goes in as it is detokenized; what comes out is safe to send to the client. OpenAI
semantics: the output ends exactly before the stop string, which itself is not returned; with
`keep_stop` (SGLang's no_stop_trim) it ends exactly after it.

    pushed so far:   ... already emitted ... | held back | <- new text
                                             `- the longest tail that is a proper prefix of
                                                some stop string; it may still become one

When several stop strings appear, the one whose last character comes first wins (that is where
token-by-token generation would have stopped); among those ending at the same place, the one
starting first. A stop string is never streamed in part. At the end of the request, `flush()`
returns the held-back text that never became a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stop: Sequence[str], keep_stop: bool = False):
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {stop!r}")
        self.stop = tuple(dict.fromkeys(stop))
        self.keep_stop = keep_stop
        self.matched: str | None = None  # the stop string that ended the text, once one has
        self._held = ""
        self._max_held_len = max((len(s) for s in self.stop), default=1) - 1

    @property
    def held_text(self) -> str:
        return self._held

    def push(self, text: str) -> str:
        """Text that can be emitted now. Once a stop string matched, the text before it (through
        it, with keep_stop) is returned and every later call returns ""."""
        if self.matched is not None:
            return ""
        buf = self._held + text
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for s in self.stop:
            start = buf.find(s)  # the first occurrence is also the one that ends first
            if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        if best is not None:
            self.matched = best[2]
            self._held = ""
            return buf[: best[0] if self.keep_stop else best[1]]
        num_held = self._partial_match_len(buf)
        self._held = buf[len(buf) - num_held :]
        return buf[: len(buf) - num_held]

    def flush(self) -> str:
        """At the end of the request: the held-back text, which can no longer become a stop string."""
        text, self._held = self._held, ""
        return "" if self.matched is not None else text

    def _partial_match_len(self, buf: str) -> int:
        """Length of the longest tail of `buf` that is a proper prefix of a stop string."""
        for n in range(min(len(buf), self._max_held_len), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
