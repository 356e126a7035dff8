"""One HTTP request to an ASGI app, in-process (no server, no socket), and a client double for the HTTP app.

    status, headers, body = call_app(build_app(state), "GET", "/server_info")

`RecordingClient` stands in for the AsyncClient an HttpState holds: it answers stats, records every
submit's keywords and answers each request with a fixed result, so a test checks what a route sends
the server and what it answers, with neither a server nor a model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zserve.client.types import GenerateResult, Usage
from zserve.common.messages import TokenizeOut


def call_app(app: Any, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, response headers, whole body) of one request; `body` (not bytes) is sent as JSON."""
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = {"Host": "127.0.0.1", **({"Content-Type": "application/json"} if raw is not None else {}), **(headers or {})}
    messages = [{"type": "http.request", "body": raw or b"", "more_body": False}]
    out: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else await asyncio.Future()  # then: wait, as a connection that stays open

    async def send(message: dict) -> None:
        out.append(message)

    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1234), "http_version": "1.1",
        "headers": [(k.lower().encode(), v.encode()) for k, v in sent.items()],
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in out if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content


@dataclass
class RecordingClient:
    """An AsyncClient double: every submit's keywords in `submitted`; each request answers `text`."""

    text: str = "ok"
    pieces: list[str] | None = None
    stats_reply: dict[str, Any] = field(default_factory=lambda: {
        "num_steps": 0, "num_waiting": 0, "num_running": 0, "num_prefilling": 0,
        "num_free_pages": 100, "num_cached_pages": 20, "num_evictable_pages": 15, "num_used_pages": 8,
    })
    submitted: list[dict[str, Any]] = field(default_factory=list)
    embedded: list[int] = field(default_factory=list)

    async def stats(self) -> dict[str, Any]:
        return dict(self.stats_reply)

    async def submit(self, /, prompt: str | None = None, **kwargs: Any) -> int:
        self.submitted.append({**({"prompt": prompt} if prompt is not None else {}), **kwargs})
        return kwargs["req_id"]

    async def stream_outputs_of(self, req_id: int) -> AsyncIterator[tuple[str, GenerateResult]]:
        """The answer in `pieces` when given (a stream in several deltas), else `text` at once."""
        pieces = self.pieces or [self.text]
        for i, piece in enumerate(pieces, start=1):
            last = i == len(pieces)
            yield piece, GenerateResult(req_id, "".join(pieces[:i]), [7] * i, "length" if last else None,
                                        Usage(prompt_tokens=3, completion_tokens=i))

    async def abort(self, req_id: int) -> None:
        return None

    async def tokenize(self, body: dict[str, Any], add_special_tokens: bool = True) -> TokenizeOut:
        """/tokenize's and /detokenize's call: recorded like a submit; ids 1, 2, 3 (their strings when asked), or
        the text of input_ids."""
        self.submitted.append({"tokenize": body, "add_special_tokens": add_special_tokens})
        if "input_ids" in body:
            return TokenizeOut(0, input_ids=list(body["input_ids"]), text=" ".join(map(str, body["input_ids"])))
        return TokenizeOut(0, input_ids=[1, 2, 3], token_strs=["a", "b", "c"] if body.get("return_token_strs") else None)

    async def submit_all(self, bodies: list[dict[str, Any]], **sampling: Any) -> list[int]:
        """/v1/embeddings' call: recorded; each answers an embedding of the body's length."""
        self.submitted.append({"bodies": bodies, **sampling})
        self.embedded = [len(str(b)) for b in bodies]
        return list(range(len(bodies)))

    async def results(self, req_ids: list[int]) -> list[GenerateResult]:
        return [GenerateResult(i, "", [], "stop", Usage(prompt_tokens=3, completion_tokens=0),
                               embedding=np.full(4, self.embedded[i] / 100, np.float32)) for i in req_ids]
