"""Token ids -> each token's own text: the text that logprobs show (and the only place it is made).

A token's own text is its decoding alone, special tokens kept: `decode([token_id])`. A byte-level
piece of a character decodes to U+FFFD; OpenAI's `bytes` then say what it is. Texts are cached
per id: logprob requests ask for the same few thousand ids again and again, and the vocabulary
bounds the cache (about 10 MB for 150k tokens).
"""

from __future__ import annotations

from collections.abc import Iterable

from zserve.common.messages import PromptLogprobs
from zserve.detokenizer_proc.incremental_detokenizer import TokenDecoder


class TokenTexts:
    def __init__(self, decoder: TokenDecoder):
        self._decoder = decoder
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decoder.decode([token_id])
        return text

    def texts(self, token_ids: Iterable[int]) -> list[str]:
        return [self.text(t) for t in token_ids]

    def prompt_text(self, token_ids: Iterable[int]) -> str:
        """A prompt given as ids, as text (completions' echo): one decoding of them all."""
        return self._decoder.decode(list(token_ids))

    def with_texts(self, prompt: PromptLogprobs) -> PromptLogprobs:
        """`prompt` with its tokens' and its top tokens' texts attached."""
        return PromptLogprobs(
            token_ids=prompt.token_ids, logprobs=prompt.logprobs,
            top_ids=prompt.top_ids, top_logprobs=prompt.top_logprobs,
            token_texts=self.texts(prompt.token_ids.tolist()), top_texts=self.texts(prompt.top_ids.tolist()),
        )
