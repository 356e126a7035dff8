"""The OpenAI response bodies: one JSON body (stream false) or SSE chunks (stream true).

Completions: object "text_completion", choices [{index, text, finish_reason, logprobs}].
Chat: object "chat.completion" / "chat.completion.chunk", choices [{index, message | delta,
finish_reason, logprobs}]; each streamed choice starts with a {"role": "assistant"} delta.
usage: prompt tokens counted once per prompt (not per copy of n), completion tokens summed,
cached prompt tokens in prompt_tokens_details.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from client.types import GenerateResult
from http_proc.openai_protocol import SubRequest
from http_proc.request_group import ChoiceEvent

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


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


class OpenAIFormatter:
    def __init__(self, is_chat: bool, model_name: str, include_usage: bool = False, req_id: int | None = None):
        """`req_id`: the request's id in the server's logs, which the OpenAI `id` then carries."""
        self.is_chat = is_chat
        self.model_name = model_name
        self.include_usage = include_usage
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex if req_id is None else req_id}"
        self.created = int(time.time())

    def body(self, subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]:
        choices = [self._choice(sub.choice_idx, r) for sub, r in zip(subs, results, strict=True)]
        return self._envelope("chat.completion" if self.is_chat else "text_completion", choices, usage_of(subs, results))

    def opening_chunks(self, num_choices: int) -> list[bytes]:
        """Chat streams announce the assistant role first, one chunk per choice."""
        if not self.is_chat:
            return []
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
                for i in range(num_choices)]

    def event_chunk(self, event: ChoiceEvent) -> bytes | None:
        """The chunk for one output, or None when it carries neither text nor the finish."""
        finish_reason = event.result.finish_reason
        if not event.delta and finish_reason is None:
            return None
        if self.is_chat:
            delta = {"content": event.delta} if event.delta else {}
            choice = {"index": event.choice_idx, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": event.choice_idx, "text": event.delta, "logprobs": None, "finish_reason": finish_reason}
        return self._chunk([choice])

    def usage_chunk(self, subs: list[SubRequest], results: list[GenerateResult]) -> bytes | None:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        if not self.include_usage:
            return None
        return sse(self._envelope(self._chunk_object, [], usage_of(subs, results)))

    # ---- pieces ------------------------------------------------------------------------------

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.is_chat else "text_completion"

    def _chunk(self, choices: list[dict]) -> bytes:
        body = self._envelope(self._chunk_object, choices, None)
        if not self.include_usage:
            del body["usage"]
        return sse(body)

    def _choice(self, idx: int, result: GenerateResult) -> dict[str, Any]:
        if self.is_chat:
            message = {"role": "assistant", "content": result.text}
            return {"index": idx, "message": message, "logprobs": None, "finish_reason": result.finish_reason}
        return {"index": idx, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}

    def _envelope(self, obj: str, choices: list[dict], usage: dict | None) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name, "choices": choices, "usage": usage}
