"""ChatFormatter: /v1/chat/completions' answer, one `chat.completion` body or `chat.completion.chunk`s.

choices [{index, message | delta, finish_reason, logprobs}]; each streamed choice starts with a
{"role": "assistant"} delta. With a reasoning parser (reasoning.py) the thinking is
`message.reasoning_content` (streamed: `delta.reasoning_content`), the rest `content`, and tool calls are
parsed from the content (streamed as vLLM streams them: each call's name once, then its arguments in
pieces; tools/stream.py). A streamed choice's text goes through its ChoiceStream (choice_stream.py).
"""

from __future__ import annotations

from typing import Any

from zserve.client.types import GenerateResult
from zserve.http_proc.apis.openai.choice_stream import ChoiceStream
from zserve.http_proc.apis.openai.formatter import Envelope, output_logprobs, usage_of
from zserve.http_proc.apis.openai.logprobs import chat_logprobs
from zserve.http_proc.apis.openai.tool_choice import ForcedToolChoice
from zserve.http_proc.reasoning import ReasoningOptions
from zserve.http_proc.shared.request_group import ChoiceEvent, SubRequest
from zserve.http_proc.tools.parser import ToolCallParser

CHUNK_OBJECT = "chat.completion.chunk"


class ChatFormatter:
    def __init__(
        self, *, model_name: str, include_usage: bool = False, req_id: int | None = None,
        wants_logprobs: bool = False, tool_parser: ToolCallParser | ForcedToolChoice | None = None,
        reasoning: ReasoningOptions | None = None,
    ):
        """`req_id`: the request's id in the server's logs, which the OpenAI `id` then carries.
        `wants_logprobs`: the request asked for logprobs (their token texts come with the results).
        `tool_parser`: the request has tools: the answer's calls become tool_calls.
        `reasoning`: a reasoning parser: the thinking is split from the content."""
        self.envelope = Envelope(id_prefix="chatcmpl", model_name=model_name, include_usage=include_usage,
                                 req_id=req_id)
        self.wants_logprobs = wants_logprobs
        self.tool_parser = tool_parser
        self.reasoning = reasoning
        self._streams: dict[int, ChoiceStream] = {}  # each streamed choice's

    @property
    def id(self) -> str:
        return self.envelope.id

    def body(self, subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]:
        choices = [self._choice(sub.choice_idx, r) for sub, r in zip(subs, results, strict=True)]
        return self.envelope.body("chat.completion", choices, usage_of(subs, results))

    def opening_chunks(self, num_choices: int) -> list[bytes]:
        """Chat streams announce the assistant role first, one chunk per choice."""
        return [
            self.envelope.chunk(CHUNK_OBJECT, [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            ])
            for i in range(num_choices)
        ]

    def event_chunk(self, event: ChoiceEvent) -> bytes | None:
        """The chunk for one output, or None when it carries neither text nor the finish."""
        finish_reason = event.result.finish_reason
        if not event.delta and finish_reason is None and not (self.wants_logprobs and event.new_ids):
            return None  # (with logprobs, tokens whose text is held back still get their chunk)
        result = event.result
        logprobs = self._logprobs(result, len(result.output_ids) - len(event.new_ids), len(result.output_ids))
        stream = self._streams.get(event.choice_idx)
        if stream is None:
            stream = self._streams[event.choice_idx] = ChoiceStream(reasoning=self.reasoning,
                                                                    tool_parser=self.tool_parser)
        delta = stream.delta(event)
        if finish_reason is not None and stream.made_calls:
            finish_reason = "tool_calls"
        if not delta and finish_reason is None and logprobs is None:
            return None
        choice = {"index": event.choice_idx, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return self.envelope.chunk(CHUNK_OBJECT, [choice])

    def usage_chunk(self, subs: list[SubRequest], results: list[GenerateResult]) -> bytes | None:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        if not self.envelope.include_usage:
            return None
        return self.envelope.usage_chunk(CHUNK_OBJECT, usage_of(subs, results))

    # ---- pieces ------------------------------------------------------------------------------

    def _choice(self, idx: int, result: GenerateResult) -> dict[str, Any]:
        logprobs = self._logprobs(result, 0, len(result.output_ids))
        text, thought = result.text, None
        if self.reasoning is not None:  # as vLLM: empty parts are null
            thought, text = self.reasoning.splitter().split(result.text)
            thought, text = thought or None, text or None
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None:
            message["reasoning_content"] = thought
        finish_reason = result.finish_reason
        if self.tool_parser is not None and text is not None:
            content, calls = self.tool_parser.parse(text)
            if calls:
                message = {**message, "content": content, "tool_calls": calls}
                finish_reason = "tool_calls"
        return {"index": idx, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def _logprobs(self, result: GenerateResult, start: int, end: int) -> dict[str, Any] | None:
        """The logprobs of output tokens start..end, when the request asked."""
        found = output_logprobs(result, start, end) if self.wants_logprobs else None
        return None if found is None else chat_logprobs(*found)
