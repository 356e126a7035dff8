"""The FastAPI application: routes, and errors in the OpenAI shape for every failure mode.

    GET  /health               200 ready | 503 starting, draining or broken (health_monitor.py)
    GET  /metrics              Prometheus text (server_metrics.py)
    GET  /v1/models            the one model served
    POST /v1/completions       openai_routes.py
    POST /v1/chat/completions  openai_routes.py
    POST /generate             generate_route.py
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from http_proc.api_error import ApiError
from http_proc.generate_route import add_generate_route
from http_proc.http_state import STATS_TIMEOUT_S, HttpState
from http_proc.openai_routes import add_openai_routes
from http_proc.response_guard import error_response


def build_app(state: HttpState) -> FastAPI:
    app = FastAPI(title="zserve", summary="OpenAI-compatible HTTP front end of a zserve server")
    add_openai_routes(app, state)
    add_generate_route(app, state)

    @app.get("/health")
    async def health() -> Response:
        healthy, detail = await state.health.check()
        return JSONResponse({"status": state.health.state, "detail": detail}, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            stats = await asyncio.wait_for(state.client.stats(), STATS_TIMEOUT_S)
        except Exception:  # rendered without the scheduler's numbers; zserve_scheduler_up says so
            stats = None
        return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        status = 404 if exc.status_code == 404 else exc.status_code
        message = f"no route {request.method} {request.url.path}" if status in (404, 405) else str(exc.detail)
        return _counted(state, request, ApiError(status, message))

    return app


def _counted(state: HttpState, request: Request, error: ApiError) -> Response:
    route = request.scope.get("route")
    state.metrics.count_response(getattr(route, "path", "unmatched"), error.status)
    if request.url.path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        state.metrics.count_failed(error.status)
    return error_response(error)
