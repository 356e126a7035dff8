"""The OpenAI response bodies: one JSON body (stream false) or SSE chunks (stream true).

Completions: object "text_completion", choices [{index, text, finish_reason, logprobs}].
Chat: object "chat.completion" / "chat.completion.chunk", choices [{index, message | delta,
finish_reason, logprobs}]; each streamed choice starts with a {"role": "assistant"} delta.
With a reasoning parser (http_proc/reasoning_parser.py) the thinking is `message.reasoning_content`
(streamed: `delta.reasoning_content`), the rest `content`, and tool calls are parsed from the content
(streamed as vLLM streams them: each call's name once, then its arguments in pieces; tool_call_stream.py).
usage: prompt tokens counted once per prompt (not per copy of n), completion tokens summed,
cached prompt tokens in prompt_tokens_details.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from zserve.client.types import GenerateResult
from zserve.http_proc.logprob_format import (
    chat_logprobs,
    completion_logprobs,
    joined_completion_logprobs,
    with_texts,
)
from zserve.http_proc.openai_protocol import SubRequest
from zserve.http_proc.reasoning_parser import ReasoningOptions, ReasoningSplit
from zserve.http_proc.request_group import ChoiceEvent
from zserve.http_proc.tool_call_parser import ToolCallParser
from zserve.http_proc.tool_call_stream import ToolCallStream
from zserve.http_proc.tool_choice import ForcedToolChoice

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
    def __init__(
        self, is_chat: bool, model_name: str, include_usage: bool = False, req_id: int | None = None,
        wants_logprobs: bool = False, tool_parser: ToolCallParser | ForcedToolChoice | None = None,
        echoes: dict[int, str | None] | None = None, prompt_only: bool = False,
        reasoning: ReasoningOptions | None = None,
    ):
        """`req_id`: the request's id in the server's logs, which the OpenAI `id` then carries.
        `wants_logprobs`: the request asked for logprobs (their token texts come with the results).
        `echoes`: completions' echo, each choice's prompt text, which its text starts with; None for
        a prompt of token ids, whose text the server sends (the result's prompt_text).
        `prompt_only`: echo with max_tokens 0; the token generated is dropped from every answer.
        `reasoning`: chat with a reasoning parser: the thinking is split from the content."""
        self.prompt_only = prompt_only
        self.reasoning = reasoning
        self._splits: dict[int, ReasoningSplit] = {}  # streamed choices' reasoning splits
        self._contents: dict[int, str] = {}  # with a reasoning parser: each streamed choice's content so far
        self._thoughts: dict[int, str] = {}  # stream_reasoning false: each choice's thinking not yet sent
        self.wants_logprobs = wants_logprobs
        self.tool_parser = tool_parser  # chat with tools: the answer's calls become tool_calls
        self.echoes = echoes
        self._echoed: set[int] = set()  # streamed choices whose prompt went out
        self._tool_streams: dict[int, ToolCallStream] = {}  # with a tool parser: each streamed choice's calls
        self.is_chat = is_chat
        self.model_name = model_name
        self.include_usage = include_usage
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex if req_id is None else req_id}"
        self.created = int(time.time())

    def body(self, subs: list[SubRequest], results: list[GenerateResult]) -> dict[str, Any]:
        results = [self._shown(r) for r in results]
        choices = [self._choice(sub.choice_idx, r) for sub, r in zip(subs, results, strict=True)]
        return self._envelope(
            "chat.completion" if self.is_chat else "text_completion", choices, usage_of(subs, results),
        )

    def opening_chunks(self, num_choices: int) -> list[bytes]:
        """Chat streams announce the assistant role first, one chunk per choice."""
        if not self.is_chat:
            return []
        return [
            self._chunk([
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            ])
            for i in range(num_choices)
        ]

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
        if self.is_chat:
            thought, content, content_delta = self._streamed_split(event)
            if self.tool_parser is not None:
                return self._tool_chunk(event.choice_idx, content, finish_reason, logprobs, thought)
            delta = {"reasoning_content": thought} if thought else {}
            if content_delta:
                delta["content"] = content_delta
            if not delta and finish_reason is None and logprobs is None:
                return None
            choice = {"index": event.choice_idx, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._chunk([choice])
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
        return self._chunk([choice])

    def usage_chunk(self, subs: list[SubRequest], results: list[GenerateResult]) -> bytes | None:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        if not self.include_usage:
            return None
        return sse(self._envelope(self._chunk_object, [], usage_of(subs, [self._shown(r) for r in results])))

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

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.is_chat else "text_completion"

    def _chunk(self, choices: list[dict]) -> bytes:
        body = self._envelope(self._chunk_object, choices, None)
        if not self.include_usage:
            del body["usage"]
        return sse(body)

    def _choice(self, idx: int, result: GenerateResult) -> dict[str, Any]:
        logprobs = self._logprobs(result, 0, len(result.output_ids), 0)
        if self.is_chat:
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
        echo = self._echo(idx, result) if self.echoes is not None else ""
        if echo and logprobs is not None:
            logprobs = self._logprobs(result, 0, len(result.output_ids), len(echo))
        prompt = self._prompt_logprobs(result) if self.echoes is not None else None
        if prompt is not None and logprobs is not None:
            logprobs = joined_completion_logprobs(prompt, logprobs)
        return {"index": idx, "text": echo + result.text, "logprobs": logprobs, "finish_reason": result.finish_reason}

    def _prompt_logprobs(self, result: GenerateResult) -> dict[str, Any] | None:
        """An echoed prompt's logprobs (completions' shape), when the request asked for logprobs."""
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

    def _streamed_split(self, event: ChoiceEvent) -> tuple[str, str, str]:
        """(thinking to send, the content so far (with a tool parser), its new part) of a streamed
        chat event; without a reasoning parser, no thinking and the whole text content."""
        if self.reasoning is None:
            return "", event.result.text, event.delta
        idx = event.choice_idx
        split = self._splits.setdefault(idx, self.reasoning.splitter())
        thought, content = split.feed(event.delta)
        if event.result.finish_reason is not None:
            more_thought, more_content = split.finish()
            thought, content = thought + more_thought, content + more_content
        if not self.reasoning.stream_reasoning:  # held until the thinking ends (or the answer does)
            thought = self._thoughts.get(idx, "") + thought
            done = not split.thinking or event.result.finish_reason is not None
            self._thoughts[idx], thought = ("", thought) if done else (thought, "")
        if self.tool_parser is not None:  # (kept only where needed: the tool parser reads the whole content)
            self._contents[idx] = self._contents.get(idx, "") + content
        return thought, self._contents.get(idx, ""), content

    def _tool_chunk(
        self, idx: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None, thought: str = "",
    ) -> bytes | None:
        """A streamed chat choice with tools (`text`, the answer's content so far): content as far as
        no call may begin, each call's name once, then its arguments as they are written
        (http_proc/tool_call_stream.py). `thought`: thinking to send first (a reasoning parser's)."""
        stream = self._tool_streams.setdefault(idx, ToolCallStream(self.tool_parser))
        delta = {"reasoning_content": thought} if thought else {}
        delta.update(stream.feed(text, final=finish_reason is not None))
        if finish_reason is not None and stream.made_calls:
            finish_reason = "tool_calls"
        if not delta and finish_reason is None and logprobs is None:
            return None
        return self._chunk([{"index": idx, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])

    def _logprobs(self, result: GenerateResult, start: int, end: int, text_offset: int) -> dict[str, Any] | None:
        """The logprobs of output tokens start..end, when the request asked."""
        if not self.wants_logprobs or result.logprobs is None:
            return None
        texts, lps = result.token_texts[start:end], result.logprobs[start:end]
        tops = None
        if result.top_logprobs:
            tops = [with_texts(top, top_texts) for top, top_texts in
                    zip(result.top_logprobs[start:end], result.top_logprob_texts[start:end], strict=True)]
        if self.is_chat:
            return chat_logprobs(texts, lps, tops)
        return completion_logprobs(texts, lps, tops, text_offset)

    def _envelope(self, obj: str, choices: list[dict], usage: dict | None) -> dict[str, Any]:
        return {
            "id": self.id, "object": obj, "created": self.created, "model": self.model_name, "choices": choices,
            "usage": usage,
        }
