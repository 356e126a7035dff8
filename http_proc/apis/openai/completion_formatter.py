"""CompletionFormatter: /v1/completions' answer, one `text_completion` body or its chunks.

choices [{index, text, finish_reason, logprobs}]. With echo each choice's text starts with its prompt
(streamed: in the choice's first chunk), and its logprobs, when asked, with the prompt's; with echo and
max_tokens 0 (`prompt_only`) the answer is the prompt alone, as OpenAI's is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zserve.client.types import GenerateResult
from zserve.http_proc.apis.openai.formatter import Envelope, output_logprobs, usage_of
from zserve.http_proc.apis.openai.logprobs import completion_logprobs, joined_completion_logprobs, with_texts
from zserve.http_proc.shared.request_group import ChoiceEvent, SubRequest

OBJECT = "text_completion"  # the body's and each chunk's


class CompletionFormatter:
    def __init__(
        self, *, model_name: str, include_usage: bool = False, req_id: int | None = None,
        wants_logprobs: bool = False, echoes: dict[int, str | None] | None = None, prompt_only: bool = False,
    ):
        """`req_id`: the request's id in the server's logs, which the OpenAI `id` then carries.
        `wants_logprobs`: the request asked for logprobs (their token texts come with the results).
        `echoes`: echo, each choice's prompt text, which its text starts with; None for a prompt of token ids,
        whose text the server sends (the result's prompt_text).
        `prompt_only`: echo with max_tokens 0; the token generated is dropped from every answer."""
        self.envelope = Envelope(id_prefix="cmpl", model_name=model_name, include_usage=include_usage, req_id=req_id)
        self.wants_logprobs = wants_logprobs
        self.echoes = echoes
        self.prompt_only = prompt_only
        self._echoed: set[int] = set()  # streamed choices whose prompt went out

    @property
    def id(self) -> str:
        return self.envelope.id

    def body(self, subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]:
        results = [self._shown(r) for r in results]
        choices = [self._choice(sub.choice_idx, r) for sub, r in zip(subs, results, strict=True)]
        return self.envelope.body(OBJECT, choices, usage_of(subs, results))

    def opening_chunks(self, num_choices: int) -> list[bytes]:
        return []  # (chat's announce the role)

    def event_chunk(self, event: ChoiceEvent) -> bytes | None:
        """The chunk for one output, or None when it carries neither text nor the finish."""
        if self.prompt_only:  # nothing streams until the end: the prompt (and its logprobs) in one chunk
            if event.result.finish_reason is None:
                return None
            event = ChoiceEvent(event.choice_idx, "", [], self._shown(event.result))
        finish_reason = event.result.finish_reason
        if not event.delta and finish_reason is None and not (self.wants_logprobs and event.new_ids):
            return None  # (with logprobs, tokens whose text is held back still get their chunk)
        result = event.result
        start = len(result.output_ids) - len(event.new_ids)
        logprobs = self._logprobs(result, start, len(result.output_ids), len(result.text) - len(event.delta))
        text = event.delta
        if self.echoes is not None:  # offsets count the echoed prompt; the prompt goes out in the first chunk
            echo = self._echo(event.choice_idx, result)
            if logprobs is not None:
                logprobs = {**logprobs, "text_offset": [o + len(echo) for o in logprobs["text_offset"]]}
            if event.choice_idx not in self._echoed:
                self._echoed.add(event.choice_idx)
                text = echo + text
                prompt = self._prompt_logprobs(result)
                if prompt is not None and logprobs is not None:
                    logprobs = joined_completion_logprobs(prompt, logprobs)
        choice = {"index": event.choice_idx, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self.envelope.chunk(OBJECT, [choice])

    def usage_chunk(self, subs: list[SubRequest], results: list[GenerateResult]) -> bytes | None:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        if not self.envelope.include_usage:
            return None
        return self.envelope.usage_chunk(OBJECT, usage_of(subs, [self._shown(r) for r in results]))

    # ---- pieces ------------------------------------------------------------------------------

    def _shown(self, result: GenerateResult) -> GenerateResult:
        """The result as the answer shows it: with prompt_only, the prompt alone (finish "length",
        0 completion tokens), as OpenAI answers echo with max_tokens 0."""
        if not self.prompt_only:
            return result
        return dataclasses.replace(
            result, text="", output_ids=[], finish_reason="length",
            logprobs=None if result.logprobs is None else [],
            top_logprobs=None if result.top_logprobs is None else [],
            token_texts=None if result.token_texts is None else [],
            top_logprob_texts=None if result.top_logprob_texts is None else [],
            usage=dataclasses.replace(result.usage, completion_tokens=0),
        )

    def _choice(self, idx: int, result: GenerateResult) -> dict[str, Any]:
        logprobs = self._logprobs(result, 0, len(result.output_ids), 0)
        echo = self._echo(idx, result) if self.echoes is not None else ""
        if echo and logprobs is not None:
            logprobs = self._logprobs(result, 0, len(result.output_ids), len(echo))
        prompt = self._prompt_logprobs(result) if self.echoes is not None else None
        if prompt is not None and logprobs is not None:
            logprobs = joined_completion_logprobs(prompt, logprobs)
        return {"index": idx, "text": echo + result.text, "logprobs": logprobs, "finish_reason": result.finish_reason}

    def _prompt_logprobs(self, result: GenerateResult) -> dict[str, Any] | None:
        """An echoed prompt's logprobs, when the request asked for logprobs."""
        if not self.wants_logprobs or result.prompt_logprobs is None:
            return None
        tops = result.prompt_top_logprobs
        text_tops = [
            with_texts(top, texts) for top, texts in zip(tops, result.prompt_top_logprob_texts, strict=True)
        ] if tops else None
        return completion_logprobs(result.prompt_token_texts, result.prompt_logprobs, text_tops)

    def _echo(self, idx: int, result: GenerateResult) -> str:
        """A choice's prompt as its echo shows it: the request's text, or the server's decoding of its ids."""
        echo = self.echoes[idx]
        return echo if echo is not None else result.prompt_text or ""

    def _logprobs(self, result: GenerateResult, start: int, end: int, text_offset: int) -> dict[str, Any] | None:
        """The logprobs of output tokens start..end, when the request asked."""
        found = output_logprobs(result, start, end) if self.wants_logprobs else None
        return None if found is None else completion_logprobs(*found, text_offset)
