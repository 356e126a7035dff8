"""The ASGI application (Starlette): routes, and errors in the OpenAI shape for every failure mode.

    GET  /health               200 ready | 503 starting, stalled, broken or draining (shared/health_monitor.py)
    GET  /health_generate      200 when one real token was generated now (a probe: not counted as traffic)
    GET  /metrics              Prometheus text (shared/server_metrics.py)
    GET  /server_info          SGLang's: the settings sglang-router reads to register a worker (shared/server_info.py)
    GET  /model_info           SGLang's: model path, tokenizer path, is_generation (shared/server_info.py)
    GET  /get_server_info, /get_model_info   the same, under SGLang's older names
    GET  /get_load             SGLang's: requests and KV tokens in use (sglang-router's power_of_two policy reads it)
    GET  /v1/models            the one model served (apis/openai/route.py)
    POST /v1/completions       apis/openai/route.py
    POST /v1/chat/completions  apis/openai/route.py
    POST /tokenize, /detokenize  vLLM's: the frontend's tokenizer (apis/openai/tokenize_route.py)
    POST /v1/responses         OpenAI's Responses API on the chat path (apis/responses/route.py)
    POST /v1/messages, /v1/messages/count_tokens   Anthropic's Messages API on the chat path (apis/anthropic/route.py)
    POST /v1/embeddings        a --task embed server's (apis/openai/embeddings_route.py)
    POST /generate             apis/sglang/route.py

Every request first passes the RequestGate (shared/request_gate.py: Host, Origin/CORS, API key, JSON
body and its size). Plain Starlette rather than FastAPI: request bodies are validated by our own pydantic models
anyway, and FastAPI's extra middleware and routing layers cost CPU on every request and every
streamed chunk, which is latency on a busy machine.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.apis.anthropic.route import anthropic_routes
from zserve.http_proc.apis.openai.embeddings_route import embeddings_routes
from zserve.http_proc.apis.openai.route import openai_routes
from zserve.http_proc.apis.openai.tokenize_route import tokenize_routes
from zserve.http_proc.apis.responses.route import responses_routes
from zserve.http_proc.apis.sglang.route import generate_routes
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.http_state import STATS_TIMEOUT_S, HttpState
from zserve.http_proc.shared.request_gate import RequestGate
from zserve.http_proc.shared.response_guard import error_response
from zserve.http_proc.shared.server_info import server_info_routes


def build_app(state: HttpState) -> RequestGate:
    async def health(request: Request) -> Response:
        healthy, detail = state.health.check()
        return JSONResponse({"status": state.health.state, "detail": detail}, status_code=200 if healthy else 503)

    async def health_generate(request: Request) -> Response:
        if state.health.is_draining:
            return JSONResponse({"status": "draining", "detail": state.health.reason}, status_code=503)
        ok, detail = await state.health.probe_generate()
        return JSONResponse({"status": "ok" if ok else "failed", "detail": detail}, status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        try:
            stats = await asyncio.wait_for(state.client.stats_out(), STATS_TIMEOUT_S)
        except Exception:  # rendered without the scheduler's numbers; zserve_scheduler_up says so
            stats = None
        return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        message = f"no route {request.method} {request.url.path}" if status in (404, 405) else str(exc.detail)
        error = ApiError(status, message)
        state.metrics.count_response("unmatched", status)
        return error_response(error)

    routes = [
        *openai_routes(state),
        *generate_routes(state),
        *tokenize_routes(state),
        *responses_routes(state),
        *anthropic_routes(state),
        *embeddings_routes(state),
        *server_info_routes(state.info, state.client),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: on_http_error})
    return RequestGate(app, state.gate, state.metrics)
