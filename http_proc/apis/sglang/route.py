"""POST /generate: the native API, mirroring the Python client's `generate` / `stream_outputs`; a body in
SGLang's shape (`text`, `sampling_params`) is read and answered in SGLang's (http_proc/apis/sglang/protocol.py).

Request: exactly one of prompt / input_ids / messages, the client's sampling keywords (max_tokens,
temperature, top_k, top_p, min_p, seed, stop, stop_token_ids, ignore_eos, return_logprob,
top_logprobs, prompt_logprobs, penalties, logit_bias, min_tokens, structured output,
skip_special_tokens, no_stop_trim; with messages, continue_final_message), and `stream` (default
false). The server validates them: unknown or bad fields get a 400 with its message. Without
max_tokens a request generates at most 128 tokens (DEFAULT_MAX_TOKENS, SGLang's native default, as
the Python client's); `"max_tokens": null` asks for up to the context.
Response: {"text", "output_ids", "finish_reason", "usage": {prompt_tokens, completion_tokens,
cached_tokens}, "logprobs"} (and "top_logprobs": [[id, logprob], ...] per token when asked; with
prompt_logprobs the first output also has "prompt_ids", "prompt_logprobs" and
"prompt_top_logprobs"); streamed, one such object per output (text and ids new in it, usage so far)
as SSE `data:` lines, then `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.client.sglang_shape import sglang_output
from zserve.client.types import GenerateResult
from zserve.common.request_limits import LIMITS
from zserve.common.sampling_params import DEFAULT_MAX_TOKENS
from zserve.http_proc.apis.sglang.protocol import from_sglang_body, is_batch, is_sglang_body
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.disconnect_watch import first_event, until_disconnect
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.refused_fields import refuse_unhonoured
from zserve.http_proc.shared.request_group import ChoiceEvent, RequestGroup, SubRequest
from zserve.http_proc.shared.response_guard import guarded, guarded_stream
from zserve.http_proc.shared.sse_response import SSE_DONE, SseResponse, sse

PROMPT_KEYS = ("prompt", "input_ids", "messages")


def generate_routes(state: HttpState) -> list[Route]:
    async def generate(request: Request) -> Response | SseResponse:
        return await guarded(state, "/generate", request, lambda: serve_generate(state, request))

    return [Route("/generate", generate, methods=["POST"])]


async def parse_body(state: HttpState, request: Request) -> tuple[list[SubRequest], bool, bool]:
    """The request (several for SGLang's batch: a list of texts or of id lists), whether it streams, and whether
    it came in SGLang's shape (http_proc/apis/sglang/protocol.py)."""
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the request body is JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    sglang = is_sglang_body(body)
    lora_path = state.take_lora_path(body)  # an adapter's name, when this server serves adapters
    if sglang:
        refuse_unhonoured(body)
        body, ignored = from_sglang_body(body)
        state.unknown_fields.check_paths([tuple(name.split(".")) for name in ignored], "/generate")
    if lora_path is not None:
        body["lora_path"] = lora_path
    stream = body.pop("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", param="stream")
    if "req_id" in body:
        raise ApiError(400, "req_id is chosen by the server; leave it out", param="req_id")
    if "n" in body:
        raise ApiError(400, "n is not supported on /generate (one result per request); use /v1/completions", param="n")
    if "embed" in body:
        raise ApiError(400, "embed is not supported on /generate: embeddings are POST /v1/embeddings (--task embed)",
                       param="embed")
    prompt = {k: body.pop(k) for k in PROMPT_KEYS if body.get(k) is not None}
    if len(prompt) != 1:
        raise ApiError(
            400, f"a request needs exactly one of prompt, input_ids, messages; got {' and '.join(prompt) or 'none'}",
        )
    body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)  # "max_tokens": null stays: up to the context
    [(key, value)] = prompt.items()
    if sglang and is_batch(key, value):
        if stream:
            raise ApiError(400, "a batch of prompts cannot stream on /generate: send one streaming request per prompt",
                           param="stream")
        if not value or len(value) > LIMITS.max_copies:
            raise ApiError(400, f"a batch has 1 to {LIMITS.max_copies} prompts, got {len(value)}", param="text")
        return [SubRequest(i, i, {key: item}, dict(body)) for i, item in enumerate(value)], False, True
    return [SubRequest(0, 0, prompt, body)], stream, sglang


async def serve_generate(state: HttpState, request: Request) -> Response | SseResponse:
    subs, stream, sglang = await parse_body(state, request)
    state.check_accepting()
    group = RequestGroup(state.client, subs, state.metrics, state.health)
    if not stream:
        results = await until_disconnect(request, group.run())
        if len(subs) > 1:  # SGLang's batch: one response per prompt, in order
            return JSONResponse([sglang_output(r) for r in results], headers=group.headers)
        [result] = results
        body = sglang_output(result) if sglang else output_body(result.text, result.output_ids, result)
        return JSONResponse(body, headers=group.headers)
    events = group.events()
    first = await first_event(request, events)
    return SseResponse(stream_outputs(state, first, events, sglang), group.headers)


def output_body(text: str, ids: list[int], result: GenerateResult, start: int = 0) -> dict[str, Any]:
    """The body for output tokens start..start+len(ids) of `result` (all of it when not streaming)."""
    usage = result.usage
    end = start + len(ids)
    body = {
        "text": text,
        "output_ids": ids,
        "finish_reason": result.finish_reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
        },
        "logprobs": None if result.logprobs is None else result.logprobs[start:end],
    }
    if result.top_logprobs is not None:  # [[token id, logprob], ...] per token, most likely first
        body["top_logprobs"] = [[list(pair) for pair in top] for top in result.top_logprobs[start:end]]
    # with the first output: the prompt's (null for its first token)
    if result.prompt_logprobs is not None and start == 0:
        body["prompt_ids"] = result.prompt_ids
        body["prompt_logprobs"] = result.prompt_logprobs
        if result.prompt_top_logprobs is not None:
            body["prompt_top_logprobs"] = [
                None if top is None else [list(pair) for pair in top] for top in result.prompt_top_logprobs
            ]
    return body


def event_body(event: ChoiceEvent) -> dict[str, Any]:
    r = event.result
    return output_body(event.delta, event.new_ids, r, len(r.output_ids) - len(event.new_ids))


def stream_outputs(
    state: HttpState, first: ChoiceEvent, events: AsyncIterator[ChoiceEvent], sglang: bool
) -> AsyncIterator[bytes]:
    """Native: each chunk the text and ids new in it; SGLang's shape: the text and ids so far."""
    body_of = (lambda event: sglang_output(event.result)) if sglang else event_body

    async def chunks() -> AsyncIterator[bytes]:
        yield sse(body_of(first))
        async for event in events:
            yield sse(body_of(event))
        yield SSE_DONE

    return guarded_stream(state, chunks(), events)
