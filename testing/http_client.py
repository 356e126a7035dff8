"""An asyncio client of the HTTP front end with the AsyncClient's interface, for benchmarks and
load drivers that want to drive the HTTP path with the code they use for the ZMQ client:

    async with HttpClient("http://127.0.0.1:8000") as c:        # instead of AsyncClient(port)
        async for delta, result in c.stream_outputs("Hello", max_tokens=16, temperature=0.0):
            ...                                                 # same (delta, result so far) pairs
        stats = await c.stats()                                 # same keys, read from /metrics

It streams POST /v1/completions (prompt or input_ids) or /v1/chat/completions (messages) with
`stream_options.include_usage`, so `result.usage` is filled at the end; `result.output_ids` stays
empty (the OpenAI API returns text). Errors raise the client's own types, picked by the error's
ErrorCode as the status and the OpenAI error `code` give it back (ServerBusyError for a 503
"server_busy", ...). Needs aiohttp (in the `test` extra); the server never imports this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from zserve.client.types import GenerateResult, ServerError, Usage, server_error
from zserve.http_proc.shared.api_error import error_code_of
from zserve.http_proc.shared.server_metrics import PREFIX, STAT_COUNTERS, STAT_GAUGES

METRIC_TO_STAT = {f"{PREFIX}_{name}": key for key, name, _ in STAT_GAUGES} | {
    f"{PREFIX}_{name}_total": key for key, name, _ in STAT_COUNTERS
}


class HttpClient:
    def __init__(self, base_url: str, *, model: str | None = None, timeout_s: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        # no pool limit: one connection per request in flight, like the ZMQ client's concurrency
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def stream_outputs(
        self, prompt: str | None = None, *, input_ids: list[int] | None = None, messages: list[dict] | None = None,
        **sampling,
    ) -> AsyncIterator[tuple[str, GenerateResult]]:
        body = {k: v for k, v in sampling.items() if v is not None}
        body.update(stream=True, stream_options={"include_usage": True})
        if self.model is not None:
            body["model"] = self.model
        if messages is not None:
            path, body["messages"] = "/v1/chat/completions", messages
        else:
            path, body["prompt"] = "/v1/completions", prompt if prompt is not None else input_ids
        result = GenerateResult(req_id=0)
        sent_s = time.perf_counter()
        # The finishing chunk is yielded once the usage chunk after it is in, and the body is read
        # to its end first, so the connection goes back to the pool for the next request.
        final_delta: str | None = None
        async with self._session.post(self.base_url + path, json=body) as response:
            if response.status != 200:
                raise _error(response.status, await response.text())
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise _error(500, json.dumps(chunk))
                delta = _fold(chunk, result, time.perf_counter() - sent_s)
                if result.finish_reason is None:
                    if delta:
                        yield delta, result
                elif final_delta is None:
                    final_delta = delta or ""
        if final_delta is None:
            raise ServerError(f"HTTP stream from {path} ended without a finish reason")
        yield final_delta, result

    async def generate(self, prompt: str | None = None, **kwargs) -> GenerateResult:
        final = GenerateResult(req_id=0)
        async for _, so_far in self.stream_outputs(prompt, **kwargs):
            final = so_far
        return final

    async def stats(self) -> dict:
        """The scheduler's stats (the keys of AsyncClient.stats() that /metrics exports); empty
        for a server without a Prometheus /metrics (llama-server without --metrics answers 501)."""
        async with self._session.get(self.base_url + "/metrics") as response:
            if response.status != 200:
                return {}
            text = await response.text()
        return {
            METRIC_TO_STAT[s.name]: int(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples if s.name in METRIC_TO_STAT
        }

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _fold(chunk: dict, result: GenerateResult, now_s: float) -> str | None:
    """Fold one SSE chunk into `result`; its text delta, or None for the usage-only chunk."""
    usage = chunk.get("usage")
    if usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        result.usage = Usage(usage["prompt_tokens"], usage["completion_tokens"], cached)
    if not chunk["choices"]:
        return None
    choice = chunk["choices"][0]
    delta = choice["delta"].get("content") or "" if "delta" in choice else choice.get("text") or ""
    if delta:
        result.text += delta
        if result.ttft_s is None:
            result.ttft_s = now_s
    if choice.get("finish_reason") is not None:
        result.finish_reason = choice["finish_reason"]
        result.latency_s = now_s
    return delta


def _error(status: int, text: str) -> ServerError:
    """The client's exception for an error response (or an in-stream error event) with `text`."""
    try:
        error = json.loads(text)["error"]
        message, api_code = str(error["message"]), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, api_code = text, None
    return server_error(f"HTTP {status}: {message}", error_code_of(status, api_code))
