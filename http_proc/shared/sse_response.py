"""A text/event-stream ASGI response that stops its producer when the client goes away.

Two tasks per response: one sends the chunks, one waits for `http.disconnect` on `receive()`.
A disconnect cancels the sending task, which throws CancelledError into the chunk generator
(and from there into the RequestGroup, which aborts its requests on the server).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive, Scope, Send

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class SseResponse:
    status_code = 200

    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str] | None = None):
        self.chunks = chunks
        self.headers = [*SSE_HEADERS, *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watching = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((sending, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not sending.done():
                sending.cancel()  # the client went away (or this task was cancelled)
                await asyncio.wait((sending,))
        if not sending.cancelled():
            sending.result()  # re-raise a fault in the stream

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def named_sse(event: dict) -> bytes:
    """One event as SSE named by its `type` (`event: <type>`), as the Responses and Messages APIs frame them."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
