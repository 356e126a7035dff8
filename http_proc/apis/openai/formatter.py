"""What the OpenAI chat and completion formatters share (chat_formatter.py, completion_formatter.py).

A response is one JSON body (stream false) or SSE chunks (stream true), every body and chunk in the same
envelope: {id, object, created, model, choices, usage}. usage: prompt tokens counted once per prompt (not
per copy of n), completion tokens summed, cached prompt tokens in prompt_tokens_details.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from zserve.client.types import GenerateResult
from zserve.http_proc.apis.openai.logprobs import TextLogprobs, with_texts
from zserve.http_proc.shared.request_group import ChoiceEvent, SubRequest
from zserve.http_proc.shared.sse_response import sse


class Formatter(Protocol):
    """What a route asks of a formatter: the body, or the chunks of a stream."""

    def body(self, subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]: ...
    def opening_chunks(self, num_choices: int) -> list[bytes]: ...
    def event_chunk(self, event: ChoiceEvent) -> bytes | None: ...
    def usage_chunk(self, subs: list[SubRequest], results: list[GenerateResult]) -> bytes | None: ...


def usage_of(subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]:
    first_of_prompt = {}
    for sub, result in zip(subs, results, strict=True):
        first_of_prompt.setdefault(sub.prompt_idx, result)
    prompt_tokens = sum(r.usage.prompt_tokens for r in first_of_prompt.values())
    completion_tokens = sum(r.usage.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(r.usage.cached_tokens for r in first_of_prompt.values())},
    }


def output_logprobs(
    result: GenerateResult, start: int, end: int,
) -> tuple[list[str], list[float], list[TextLogprobs | None] | None] | None:
    """(token texts, logprobs, top logprobs as texts) of output tokens start..end; None when the result has none."""
    if result.logprobs is None:
        return None
    tops = None
    if result.top_logprobs:
        tops = [with_texts(top, top_texts) for top, top_texts in
                zip(result.top_logprobs[start:end], result.top_logprob_texts[start:end], strict=True)]
    return result.token_texts[start:end], result.logprobs[start:end], tops


class Envelope:
    """One response's id, creation time and model, around each body and chunk."""

    def __init__(self, *, id_prefix: str, model_name: str, include_usage: bool, req_id: int | None):
        """`req_id`: the request's id in the server's logs, which the OpenAI `id` then carries."""
        self.id = f"{id_prefix}-{uuid.uuid4().hex if req_id is None else req_id}"
        self.created = int(time.time())
        self.model_name = model_name
        self.include_usage = include_usage

    def body(self, obj: str, choices: list[dict], usage: dict | None) -> dict[str, Any]:
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model_name, "choices": choices,
            "usage": usage,
        }

    def chunk(self, obj: str, choices: list[dict]) -> bytes:
        body = self.body(obj, choices, None)
        if not self.include_usage:
            del body["usage"]
        return sse(body)

    def usage_chunk(self, obj: str, usage: dict[str, Any]) -> bytes:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return sse(self.body(obj, [], usage))
