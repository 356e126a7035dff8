"""Run a piece of request work until it is done or the HTTP client disconnects, whichever is first.

Once the request body is read, the ASGI `receive()` only returns when the connection is closed
(`http.disconnect`), so awaiting it next to the work tells us when to stop. The work is
cancelled on a disconnect; a cancelled RequestGroup aborts its requests on the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before its response was ready."""


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`await work`, unless the client disconnects first: then cancel it and raise ClientDisconnected."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait((work_task, watch_task), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
    if work_task.done() and not work_task.cancelled():
        return work_task.result()
    raise ClientDisconnected()


async def first_event(request: Request, events: AsyncGenerator[T, None]) -> T:
    """A stream's first item, unless the client disconnects first (the status line waits for it, so an error
    before the first token is an error response); the stream is closed when that fails."""
    try:
        return await until_disconnect(request, anext(events))
    except BaseException:
        await events.aclose()
        raise
