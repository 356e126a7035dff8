"""POST /v1/responses: OpenAI's Responses API, answered on the chat path (responses_protocol.py in,
responses_events.py out). Errors are OpenAI-shaped, as on the other OpenAI routes; a failure
mid-stream is an `error` event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.api_error import ApiError
from zserve.http_proc.chat_call import ChatCall
from zserve.http_proc.http_state import HttpState
from zserve.http_proc.openai_protocol import parse_body
from zserve.http_proc.refused_fields import refuse_unhonoured
from zserve.http_proc.response_guard import guarded, guarded_stream
from zserve.http_proc.responses_events import ResponseEnvelope, ResponsesStream
from zserve.http_proc.responses_protocol import ResponsesRequest
from zserve.http_proc.sse_response import SseResponse, named_sse

ROUTE = "/v1/responses"


def responses_routes(state: HttpState) -> list[Route]:
    async def responses(request: Request) -> Response | SseResponse:
        return await guarded(state, ROUTE, request, lambda: serve_responses(state, request))

    return [Route(ROUTE, responses, methods=["POST"])]


async def serve_responses(state: HttpState, request: Request) -> Response | SseResponse:
    body = parse_body(ResponsesRequest, await request.body())
    refuse_unhonoured(body.model_extra)
    state.unknown_fields.check(body, ROUTE)
    call = ChatCall(state, request, body.chat_request())
    envelope = ResponseEnvelope(body, state.model_name)
    if not body.stream:
        return JSONResponse(envelope.from_chat(await call.answer()), headers=call.headers)
    chunks, events = await call.open_stream()
    return SseResponse(guarded_stream(state, response_events(state, envelope, chunks), events), call.headers)


async def response_events(
    state: HttpState, envelope: ResponseEnvelope, chunks: AsyncIterator[dict[str, Any]],
) -> AsyncIterator[bytes]:
    stream = ResponsesStream(envelope)
    for event in stream.opening():
        yield named_sse(event)
    try:
        async for chunk in chunks:
            for event in stream.feed(chunk):
                yield named_sse(event)
    except Exception as exc:  # the Responses API's error event (guarded_stream would send the chat shape)
        error = ApiError.from_client_error(exc)
        state.metrics.count_failed(error.status)
        yield named_sse(stream.event("error", code=error.code, message=error.message, param=error.param))
        return
    for event in stream.closing():
        yield named_sse(event)
