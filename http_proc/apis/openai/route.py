"""POST /v1/completions and /v1/chat/completions: one JSON body, or SSE chunks then `data: [DONE]`.

A streamed response starts once the first output (or an error) is back, so a request the server
refuses (bad input, queue full) gets a real 400 / 503 status, not a 200 stream with an error in it.
An error after that arrives as a `data: {"error": ...}` chunk, which the OpenAI SDK raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.completion_formatter import CompletionFormatter
from zserve.http_proc.apis.openai.formatter import Formatter
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest, with_tool_markup
from zserve.http_proc.shared.disconnect_watch import first_event, until_disconnect
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.refused_fields import refuse_unhonoured
from zserve.http_proc.shared.request_body import parse_body
from zserve.http_proc.shared.request_group import ChoiceEvent, RequestGroup, SubRequest
from zserve.http_proc.shared.response_guard import guarded, guarded_stream
from zserve.http_proc.shared.sse_response import SSE_DONE, SseResponse


def openai_routes(state: HttpState) -> list[Route]:
    async def completions(request: Request) -> Response | SseResponse:
        return await guarded(state, "/v1/completions", request, lambda: serve(state, request, CompletionRequest))

    async def chat_completions(request: Request) -> Response | SseResponse:
        return await guarded(
            state, "/v1/chat/completions", request, lambda: serve(state, request, ChatCompletionRequest),
        )

    async def models(request: Request) -> Response:
        card = {
            "id": state.model_name, "object": "model", "created": state.created_s, "owned_by": "zserve",
            "root": state.model_path, "max_model_len": state.context_len,
        }
        # vLLM lists each LoRA adapter as a model of its own, its parent the base model
        adapters = [{**card, "id": name, "root": name, "parent": state.model_name} for name in state.lora_names]
        return JSONResponse({"object": "list", "data": [card, *adapters]})

    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]


async def serve(
    state: HttpState, request: Request, model: type[CompletionRequest | ChatCompletionRequest],
) -> Response | SseResponse:
    body = parse_body(model, await request.body())
    lora_path = state.take_lora_path(body.model_extra)  # SGLang's field, when this server serves adapters
    refuse_unhonoured(body.model_extra)
    state.unknown_fields.check(body, request.url.path)
    lora_path = state.check_model_or_adapter(body.model) or lora_path  # vLLM's: the adapter's name as the model
    state.check_accepting()
    if isinstance(body, ChatCompletionRequest):
        subs, group, formatter = chat_call_parts(state, body, lora_path)
    else:
        subs, group, formatter = completion_call_parts(state, body, lora_path)
    if not body.stream:
        results = await until_disconnect(request, group.run())
        return JSONResponse(formatter.body(subs, results), headers=group.headers)
    events = group.events()
    first = await first_event(request, events)
    chunks = stream_chunks(state, formatter, subs, group, first, events)
    return SseResponse(chunks, group.headers)


def chat_call_parts(
    state: HttpState, body: ChatCompletionRequest, lora_path: str | None = None,
) -> tuple[list[SubRequest], RequestGroup, ChatFormatter]:
    """A chat request's choices, their group, and its formatter; `lora_path`: the LoRA adapter computing them."""
    tool_parser = body.tool_parser(state.tool_parser)
    subs = with_tool_markup(body.thinking_first(body.sub_requests(), state.reasoning_parser), tool_parser)
    subs = with_adapter(subs, lora_path)
    group = RequestGroup(state.client, subs, state.metrics, state.health)
    formatter = ChatFormatter(model_name=state.model_name, include_usage=body.include_usage, req_id=group.req_id,
                              wants_logprobs=body.wants_logprobs, tool_parser=tool_parser,
                              reasoning=body.reasoning(state.reasoning_parser))
    return subs, group, formatter


def completion_call_parts(
    state: HttpState, body: CompletionRequest, lora_path: str | None = None,
) -> tuple[list[SubRequest], RequestGroup, CompletionFormatter]:
    """A completion request's choices, their group, and its formatter; `lora_path`: the LoRA adapter computing them."""
    subs = with_adapter(body.sub_requests(), lora_path)
    echoes = None
    if body.echo:  # each choice's text starts with its prompt
        subs = [echoed(s) for s in subs]
        echoes = {s.choice_idx: s.prompt.get("prompt") for s in subs}
    group = RequestGroup(state.client, subs, state.metrics, state.health)
    formatter = CompletionFormatter(model_name=state.model_name, include_usage=body.include_usage, req_id=group.req_id,
                                    wants_logprobs=body.wants_logprobs, echoes=echoes,
                                    prompt_only=body.scores_prompt_only)
    return subs, group, formatter


def with_adapter(subs: list[SubRequest], lora_path: str | None) -> list[SubRequest]:
    """Every choice computed by the LoRA adapter `lora_path` (None: the base model)."""
    return subs if lora_path is None else [replace(s, sampling={**s.sampling, "lora_path": lora_path}) for s in subs]


def echoed(sub: SubRequest) -> SubRequest:
    """A choice whose prompt is echoed: a prompt of token ids comes back as text from the server."""
    return sub if "prompt" in sub.prompt else replace(sub, sampling={**sub.sampling, "return_prompt_text": True})


def stream_chunks(
    state: HttpState, formatter: Formatter, subs: list[SubRequest], group: RequestGroup,
    first: ChoiceEvent, events: AsyncIterator[ChoiceEvent],
) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in formatter.opening_chunks(len(subs)):
            yield chunk
        event: ChoiceEvent | None = first
        while event is not None:
            chunk = formatter.event_chunk(event)
            if chunk is not None:
                yield chunk
            event = await anext(events, None)
        usage = formatter.usage_chunk(subs, [r for r in group.results if r is not None])
        if usage is not None:
            yield usage
        yield SSE_DONE

    return guarded_stream(state, chunks(), events)
