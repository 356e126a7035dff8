"""POST /v1/responses: OpenAI's Responses API, answered on the chat path (apis/responses/protocol.py in,
apis/responses/events.py out). Errors are OpenAI-shaped, as on the other OpenAI routes; a failure
mid-stream is an `error` event."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.apis.openai.chat_call import ChatCall, translated_events
from zserve.http_proc.apis.responses.events import ResponseEnvelope, ResponsesStream
from zserve.http_proc.apis.responses.protocol import ResponsesRequest
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.refused_fields import refuse_unhonoured
from zserve.http_proc.shared.request_body import parse_body
from zserve.http_proc.shared.response_guard import guarded, guarded_stream
from zserve.http_proc.shared.sse_response import SseResponse

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
    api_events = translated_events(state, ResponsesStream(envelope), chunks)
    return SseResponse(guarded_stream(state, api_events, events), call.headers)


