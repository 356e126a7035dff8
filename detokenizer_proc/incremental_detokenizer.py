"""One request's output tokens -> streamed text, UTF-8 safe, with stop strings.

Created when a request starts, dropped when it ends; the detokenizer process owns it.

Each step decodes only a short window, not the whole output (that would be O(n^2)):

    token_ids:  [ .......... emitted .......... | prefix tokens | new tokens ]
                                                ^prefix_offset  ^read_offset
    prefix_text = decode(ids[prefix_offset:read_offset])
    window_text = decode(ids[prefix_offset:])
    new text    = window_text[len(prefix_text):]

Decoding the prefix tokens along with the new ones gives the decoder the context it needs:
sentencepiece-style decoders strip the leading space of the first token decoded, and a
character's bytes may be spread over several tokens. The new text is held back (offsets stay)
while it ends in U+FFFD, a character whose bytes are still arriving, and, for byte-fallback
vocabularies (`<0xE4>` tokens), while the window ends in an open run of byte tokens:
tokenizers decodes such a run all-or-nothing, so one more byte can turn the whole run into
U+FFFD. (Probe: decode the window plus one invalid byte token; if the text so far changes, the
run is open.) The offsets also stay when nothing new decoded (a skipped special token), so a
window never starts at text the decoder would strip.

Invariant: the concatenation of everything returned (up to a stop string, or through it with keep_stop) equals
`decode(token_ids, skip_special_tokens)`, and emitted text never changes. The one exception is
bounded work: after MAX_HELD_TOKENS tokens held back in a row (far more than any character
needs; only garbage output gets there) the window text is emitted as decoded so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from zserve.detokenizer_proc.stop_matcher import StopMatcher

REPLACEMENT_CHAR = "\ufffd"
MAX_HELD_TOKENS = 64


class TokenDecoder(Protocol):
    """What the detokenizer needs from a tokenizer (tokenizer_proc.text_tokenizer.TextTokenizer)."""

    # A token decoding to a lone invalid UTF-8 byte (`<0x80>`) in byte-fallback vocabularies, else None.
    invalid_byte_token_id: int | None

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, decoder: TokenDecoder, stop: Sequence[str] = (), skip_special_tokens: bool = True,
        keep_stop: bool = False,
    ):
        """`keep_stop`: the text ends with the stop string that ended it (SGLang's no_stop_trim), not before it."""
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._stop_matcher = StopMatcher(stop, keep_stop) if stop else None
        self.token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def stopped(self) -> bool:
        """A stop string matched: the request is finished with reason "stop"."""
        return self.stop_matched is not None

    @property
    def stop_matched(self) -> str | None:
        """The stop string that ended the text, or None. Once set, the request is finished
        with reason "stop" and further tokens are ignored."""
        return self._stop_matcher.matched if self._stop_matcher is not None else None

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the text that can be streamed now (maybe "")."""
        if self.stop_matched is not None:
            return ""
        self.token_ids.extend(token_ids)
        return self._through_stop(self._decode_window(final=False))

    def add_tokens_until_stop(self, token_ids: Sequence[int]) -> tuple[str, int]:
        """Several tokens of one step (speculative drafts), fed one by one so a stop string ends
        the output at the token that completes it, as one-token steps would: returns the text and
        how many of `token_ids` were taken (all, unless a stop string matched)."""
        if self._stop_matcher is None or len(token_ids) < 2:
            return self.add_tokens(token_ids), len(token_ids)
        text = ""
        for k, token_id in enumerate(token_ids):
            text += self.add_tokens([token_id])
            if self.stopped:
                return text, k + 1
        return text, len(token_ids)

    def flush(self) -> str:
        """The request ended (length, stop token, abort): return all text still held back."""
        if self.stop_matched is not None:
            return ""
        text = self._through_stop(self._decode_window(final=True))
        if self._stop_matcher is not None:
            text += self._stop_matcher.flush()
        return text

    def _decode_window(self, final: bool) -> str:
        ids, start, read = self.token_ids, self._prefix_offset, self._read_offset
        if read == len(ids):
            return ""
        prefix_text = self._decode(ids[start:read])
        window_text = self._decode(ids[start:])
        if len(window_text) <= len(prefix_text):
            return ""  # nothing new yet (e.g. a skipped special token); keep the window
        if not final and len(ids) - read < MAX_HELD_TOKENS and self._may_change(window_text):
            return ""
        # The prefix text was emitted with the previous step and never ends mid-character, so
        # decoding more tokens after it only appends to it.
        self._prefix_offset, self._read_offset = read, len(ids)
        return window_text[len(prefix_text) :]

    def _may_change(self, window_text: str) -> bool:
        """Whether more tokens could change the end of `window_text` (decoded from prefix_offset)."""
        if window_text.endswith(REPLACEMENT_CHAR):
            return True
        probe = self._decoder.invalid_byte_token_id
        if probe is None:
            return False
        probed = self._decode([*self.token_ids[self._prefix_offset :], probe])
        return not probed.startswith(window_text)

    def _decode(self, token_ids: list[int]) -> str:
        return self._decoder.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def _through_stop(self, text: str) -> str:
        return self._stop_matcher.push(text) if self._stop_matcher is not None else text
