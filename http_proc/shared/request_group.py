"""The choices of one HTTP request in flight, as one merged stream of events.

Each SubRequest is one choice; the choices of one prompt go to the server as one request with
`n` (so it computes the prompt once), and each is read back by its id. `events()` yields a
ChoiceEvent per output of any choice, in arrival order. (Latencies are measured by the frontend,
for every door: tokenizer_proc/request_metrics.py.)
Leaving `events()` early (the HTTP client went away, or an error) aborts every choice still
running: the client's stream aborts its request when closed or cancelled.

A choice that ends with finish reason "abort" that this process did not ask for was ended by
the server shutting down: that raises ApiError 503 and marks the server as draining.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from zserve.client.async_client import AsyncClient
from zserve.client.request_body import new_req_id
from zserve.client.types import GenerateResult
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.server_metrics import ServerMetrics


@dataclass(frozen=True)
class SubRequest:
    """One choice of an HTTP request: the client's prompt keyword and sampling keywords."""

    choice_idx: int
    prompt_idx: int
    prompt: dict[str, Any]  # {"prompt": str} | {"input_ids": [...]} | {"messages": [...]}
    sampling: dict[str, Any]


@dataclass(slots=True)
class ChoiceEvent:
    choice_idx: int
    delta: str  # new text ("" for an output that only held text back, or the last one)
    new_ids: list[int]  # the tokens behind this output
    result: GenerateResult  # the choice so far; finish_reason set on its last event


@dataclass(slots=True)
class ChoiceProgress:
    num_ids: int = 0  # output ids already handed out as events


class RequestGroup:
    def __init__(self, client: AsyncClient, subs: list[SubRequest], metrics: ServerMetrics, health: HealthMonitor):
        self.client = client
        self.subs = subs
        self.metrics = metrics
        self.health = health
        self.progress = [ChoiceProgress() for _ in subs]
        self.req_id = new_req_id()  # choice i is request req_id + i in the server's logs; X-Request-Id says req_id
        self.results: list[GenerateResult | None] = [None] * len(subs)

    @property
    def headers(self) -> dict[str, str]:
        """The response's headers: X-Request-Id is the id the server's log lines name (`req N`)."""
        return {"X-Request-Id": str(self.req_id)}

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        await self._submit_all()
        if len(self.subs) == 1:
            async with contextlib.aclosing(self._choice_events(self.subs[0])) as single:
                async for event in single:
                    yield event
            return
        async with contextlib.aclosing(self._merged_events()) as merged:
            async for event in merged:
                yield event

    async def run(self) -> list[GenerateResult]:
        """Every choice's final result, in choice order."""
        async with contextlib.aclosing(self.events()) as events:
            async for _ in events:
                pass
        return [r for r in self.results if r is not None]

    async def _submit_all(self) -> None:
        """One request per prompt, with `n` = its choices: the server queues them together and
        computes the prompt once; choice c of the group is request self.req_id + c."""
        firsts = [
            sub for sub in self.subs
            if sub.choice_idx == min(s.choice_idx for s in self.subs if s.prompt_idx == sub.prompt_idx)
        ]
        submitted: list[int] = []
        try:
            for sub in firsts:
                num_choices = sum(s.prompt_idx == sub.prompt_idx for s in self.subs)
                n = {"n": num_choices} if num_choices > 1 else {}
                req_id = self.req_id + sub.choice_idx
                # the route decides max_tokens: none in a SubRequest is up to the context (OpenAI's meaning),
                # not the Python client's native default; /generate puts that default in itself
                sampling = {"max_tokens": None, **sub.sampling}
                await self.client.submit(req_id=req_id, **sub.prompt, **sampling, **n)
                submitted.append(req_id)
        except BaseException:
            for req_id in submitted:
                await self.client.abort(req_id)
            raise

    async def _choice_events(self, sub: SubRequest) -> AsyncIterator[ChoiceEvent]:
        progress = self.progress[sub.choice_idx]
        req_id = self.req_id + sub.choice_idx
        finished = False
        try:
            async for delta, result in self.client.stream_outputs_of(req_id):
                new_ids = result.output_ids[progress.num_ids :]
                progress.num_ids = len(result.output_ids)
                finished = result.finish_reason is not None
                if result.finish_reason == "abort":
                    self.health.mark_draining("the server ended a request with finish reason abort (shutting down)")
                    self.metrics.count_aborted("server")
                    raise ApiError(503, "the server is shutting down; the request was aborted", code="server_draining")
                if finished:
                    self.results[sub.choice_idx] = result
                yield ChoiceEvent(sub.choice_idx, delta, new_ids, result)
        finally:
            if not finished:
                # The client's stream aborts too, but only once the generator is collected; this
                # abort is at once. (Completes without suspending, so it runs even when cancelled.)
                await self.client.abort(req_id)

    async def _merged_events(self) -> AsyncIterator[ChoiceEvent]:
        queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()

        async def pump(sub: SubRequest) -> None:
            try:
                async for event in self._choice_events(sub):
                    queue.put_nowait(event)
                queue.put_nowait(None)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # handed to the consumer, which raises it
                queue.put_nowait(exc)

        tasks = [asyncio.create_task(pump(sub)) for sub in self.subs]
        try:
            num_running = len(tasks)
            while num_running:
                item = await queue.get()
                if item is None:
                    num_running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()  # each cancelled stream aborts its request
