"""Every generation route's outcome as a response: errors become OpenAI-shaped JSON, and the
response is counted by route and status. A client that went away gets a 499 nobody reads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from zserve.client.types import ServerError
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.disconnect_watch import ClientDisconnected
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.sse_response import SseResponse, sse

logger = logging.getLogger("http_proc")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that closed the connection first


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def guarded(
    state: HttpState, route: str, request: Request, handler: Callable[[], Awaitable[Response | SseResponse]],
) -> Response | SseResponse:
    try:
        response = await handler()
    except ClientDisconnected:
        logger.info("%s: client disconnected before the response; its requests were aborted", route)
        state.metrics.count_aborted("client_disconnect")
        response = Response(status_code=CLIENT_CLOSED_REQUEST)
    except Exception as exc:
        error = ApiError.from_client_error(exc)
        if not isinstance(exc, (ApiError, ServerError)):
            logger.exception("%s: internal error", route)
        state.metrics.count_failed(error.status)
        response = error_response(error)
    state.metrics.count_response(route, response.status_code)
    return response


async def guarded_stream(
    state: HttpState, chunks: AsyncIterator[bytes], events: AsyncIterator,
) -> AsyncIterator[bytes]:
    """A streamed body's outcome: a client disconnect (Starlette cancels the stream) is counted,
    a failure mid-stream ends the stream with an error event, and `events` is always closed."""
    try:
        async for chunk in chunks:
            yield chunk
    except asyncio.CancelledError:
        state.metrics.count_aborted("client_disconnect")
        raise
    except Exception as exc:
        error = ApiError.from_client_error(exc)
        state.metrics.count_failed(error.status)
        yield sse(error.body())
    finally:
        await events.aclose()
