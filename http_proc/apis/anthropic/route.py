"""POST /v1/messages (Anthropic's Messages API) on the chat path (apis/anthropic/protocol.py in,
apis/anthropic/events.py out), and POST /v1/messages/count_tokens (the prompt rendered as a chat's).

Every error is Anthropic-shaped (shared/anthropic_error.py), a failure mid-stream an `error` event; the
API key may come as `x-api-key`, as the anthropic SDK sends it (shared/request_gate.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.apis.anthropic.events import MessageEnvelope, MessagesStream
from zserve.http_proc.apis.anthropic.protocol import MessagesRequest
from zserve.http_proc.apis.openai.chat_call import ChatCall, translated_events
from zserve.http_proc.shared.anthropic_error import anthropic_error_body
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.refused_fields import refuse_unhonoured
from zserve.http_proc.shared.request_body import parse_body
from zserve.http_proc.shared.response_guard import guarded, guarded_stream
from zserve.http_proc.shared.sse_response import SseResponse

ROUTE = "/v1/messages"
COUNT_ROUTE = "/v1/messages/count_tokens"


class CountTokensRequest(MessagesRequest):
    max_tokens: int = 1  # not part of a count request


def anthropic_routes(state: HttpState) -> list[Route]:
    async def messages(request: Request) -> Response | SseResponse:
        return await anthropic_guarded(state, ROUTE, request, lambda: serve_messages(state, request))

    async def count_tokens(request: Request) -> Response:
        return await anthropic_guarded(state, COUNT_ROUTE, request, lambda: serve_count_tokens(state, request))

    return [Route(ROUTE, messages, methods=["POST"]), Route(COUNT_ROUTE, count_tokens, methods=["POST"])]


async def anthropic_guarded(
    state: HttpState, route: str, request: Request, handler: Callable[[], Awaitable[Response | SseResponse]],
) -> Response | SseResponse:
    """guarded()'s outcome, an error in Anthropic's shape."""
    response = await guarded(state, route, request, handler)
    if response.status_code < 400 or not isinstance(response, JSONResponse):
        return response
    message = json.loads(response.body)["error"]["message"]
    return JSONResponse(anthropic_error_body(response.status_code, message), status_code=response.status_code)


async def serve_messages(state: HttpState, request: Request) -> Response | SseResponse:
    body = parse_body(MessagesRequest, await request.body())
    refuse_unhonoured(body.model_extra)
    state.unknown_fields.check(body, ROUTE)
    call = ChatCall(state, request, body.chat_request())
    envelope = MessageEnvelope(state.model_name, body.stop_sequences or [])
    if not body.stream:
        return JSONResponse(envelope.from_chat(await call.answer()), headers=call.headers)
    chunks, events = await call.open_stream()
    api_events = translated_events(state, MessagesStream(envelope), chunks)
    return SseResponse(guarded_stream(state, api_events, events), call.headers)


async def serve_count_tokens(state: HttpState, request: Request) -> Response:
    body = parse_body(CountTokensRequest, await request.body())
    state.unknown_fields.check(body, COUNT_ROUTE)
    state.check_model(body.model)
    chat = body.chat_request()
    prompt = chat.sub_requests()[0].prompt
    answer = await state.client.tokenize(prompt, False)
    return JSONResponse({"input_tokens": len(answer.input_ids)})
