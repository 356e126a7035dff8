"""ChatCall: one /v1/chat/completions request run for another API's route (/v1/responses, /v1/messages).

Those routes translate their request into a ChatCompletionRequest and the chat answer back into
their own shape, so sampling, the chat template, tool-call and reasoning parsing are the chat
path's, not copied. The answer comes as the chat route would send it: the `chat.completion` body,
or its stream as `chat.completion.chunk` dicts (the usage in a last chunk with no choices). A
streamed call starts once the first output (or an error) is back, as the chat route's does, so a
refused request still gets a real error status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError
from starlette.requests import Request

from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, with_tool_markup
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.disconnect_watch import first_event, until_disconnect
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_group import ChoiceEvent, RequestGroup, SubRequest
from zserve.http_proc.shared.sse_response import named_sse

SSE_PREFIX = b"data: "


@dataclass
class ChatCall:
    state: HttpState
    request: Request
    body: ChatCompletionRequest  # one choice (n = 1); stream_options.include_usage when streamed

    def __post_init__(self) -> None:
        self.state.check_model(self.body.model)
        self.state.check_accepting()
        tool_parser = self.body.tool_parser(self.state.tool_parser)
        subs = self.body.thinking_first(self.body.sub_requests(), self.state.reasoning_parser)
        self.subs: list[SubRequest] = with_tool_markup(subs, tool_parser)
        self.group = RequestGroup(self.state.client, self.subs, self.state.metrics, self.state.health)
        self.formatter = ChatFormatter(
            model_name=self.state.model_name, include_usage=self.body.include_usage, req_id=self.group.req_id,
            tool_parser=tool_parser, reasoning=self.body.reasoning(self.state.reasoning_parser),
        )

    @property
    def headers(self) -> dict[str, str]:
        return self.group.headers

    async def answer(self) -> dict[str, Any]:
        """The `chat.completion` body."""
        results = await until_disconnect(self.request, self.group.run())
        return self.formatter.body(self.subs, results)

    async def open_stream(self) -> tuple[AsyncIterator[dict[str, Any]], AsyncIterator[ChoiceEvent]]:
        """(the chunks, the events behind them): the caller closes the events (guarded_stream does)."""
        events = self.group.events()
        first = await first_event(self.request, events)
        return self._chunks(first, events), events

    async def _chunks(self, first: ChoiceEvent, events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[dict[str, Any]]:
        event: ChoiceEvent | None = first
        while event is not None:
            chunk = self.formatter.event_chunk(event)
            if chunk is not None:
                yield chunk_dict(chunk)
            event = await anext(events, None)
        usage = self.formatter.usage_chunk(self.subs, [r for r in self.group.results if r is not None])
        if usage is not None:
            yield chunk_dict(usage)


def chat_request_of(values: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request a translation built (None values left out); a 400 if it is not a valid one."""
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"invalid request: as a chat request, {where}: {first['msg']}") from None


def chunk_dict(sse_bytes: bytes) -> dict[str, Any]:
    """A chat stream's SSE chunk (`data: {...}`) as its JSON object."""
    assert sse_bytes.startswith(SSE_PREFIX), sse_bytes[:40]
    return json.loads(sse_bytes[len(SSE_PREFIX):])


class TranslatedStream(Protocol):
    """An API's events made from the chat stream's chunks (apis/responses/events.py, apis/anthropic/events.py),
    each walking them with a ChatChunkWalk (chat_chunks.py)."""

    def opening(self) -> list[dict[str, Any]]: ...
    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]: ...
    def closing(self) -> list[dict[str, Any]]: ...
    def error_event(self, error: ApiError) -> dict[str, Any]: ...


async def translated_events(
    state: HttpState, stream: TranslatedStream, chunks: AsyncIterator[dict[str, Any]],
) -> AsyncIterator[bytes]:
    """`stream`'s events as named SSE: its opening, one batch per chat chunk, its closing; a failure mid-stream
    is the API's own error event (guarded_stream would send the chat's shape)."""
    for event in stream.opening():
        yield named_sse(event)
    try:
        async for chunk in chunks:
            for event in stream.feed(chunk):
                yield named_sse(event)
    except Exception as exc:  # any failure becomes the API's error event, counted
        error = ApiError.from_client_error(exc)
        state.metrics.count_failed(error.status)
        yield named_sse(stream.error_event(error))
        return
    for event in stream.closing():
        yield named_sse(event)
