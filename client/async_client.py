"""The asyncio ZMQ client (uvloop-friendly).

    async with AsyncClient(port) as c:
        result = await c.generate("Hello", max_tokens=16)
        async for delta in c.stream(messages=[{"role": "user", "content": "Hi"}]):
            ...

One reader task files every frame through the ClientCore (client_core.py, shared with Client:
this file is only the asyncio I/O around it) and wakes the reader of that request; one heartbeat
task tells the server this client is alive. Many requests may be in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from zserve.client.client import client_address
from zserve.client.client_core import ClientCore
from zserve.client.connection_watch import ConnectionWatch, lost_message
from zserve.client.request_body import num_copies, refuse_copies
from zserve.client.result_builder import ResultBuilder
from zserve.client.types import GenerateResult, RequestTimeoutError, ServerGoneError, resolve_api_key
from zserve.common.messages import StatsOut, TokenizeOut
from zserve.common.server_config import DEFAULT_CLIENT_PORT

LOST_GRACE_S = 0.2  # after the connection closes, outputs already received are filed before requests fail


class AsyncClient:
    def __init__(
        self, port_or_address: int | str = DEFAULT_CLIENT_PORT, *, host: str = "127.0.0.1",
        timeout_s: float | None = None, heartbeat_interval_s: float = 1.0, server_timeout_s: float = 15.0,
        api_key: str | None = None, client_id: str | None = None,
    ):
        """`api_key` as for Client: None = $ZSERVE_API_KEY, "" = none. `client_id` names this client
        to the server (default: a random one); one starting with common.messages.PROBE_CLIENT_PREFIX
        marks health probes, which the server counts nowhere."""
        self.address = client_address(port_or_address, host)
        self.api_key = resolve_api_key(api_key)
        self.timeout_s = timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.server_timeout_s = server_timeout_s
        self._core = ClientCore(client_id, self.api_key)
        self.client_id = self._core.client_id
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._watch = ConnectionWatch(self._sock)  # before connect, so the first CONNECTED event is seen
        self._sock.connect(self.address)
        # req_id (a request's or a stats request's) -> its reader's wake-up
        self._waiters: dict[int, asyncio.Future[bool]] = {}
        self._tasks: list[asyncio.Task] = []

    def _ensure_started(self) -> None:
        if not self._tasks:
            self._core.last_ack_s = time.monotonic()
            self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._heartbeat_loop()),
                           asyncio.create_task(self._watch_loop())]

    async def submit(
        self, /, prompt: str | None = None, *, input_ids: list[int] | None = None, messages: list[dict] | None = None,
        req_id: int | None = None, **sampling,
    ) -> int:
        """Send a request without waiting; returns its req_id, to read back with `result(req_id)`
        or `stream_of(req_id)` (once: a request's outputs are read by one of them). With `n=4`
        the server answers 4 choices of the prompt, computed once: requests req_id .. req_id + 3."""
        self._ensure_started()
        if self._watch.lost:
            raise ServerGoneError(lost_message(self.address))
        req_id, frame = self._core.submit(prompt, input_ids, messages, req_id, sampling)
        await self._sock.send(frame)
        return req_id

    async def generate(self, /, prompt: str | None = None, **kwargs) -> GenerateResult:
        """One result (n above 1 is refused: see generate_batch)."""
        refuse_copies(kwargs, "generate")
        return await self.result(await self.submit(prompt, **kwargs))

    async def result(self, req_id: int) -> GenerateResult:
        """The whole result of a request `submit`ted earlier, once it ends."""
        self._core.check_in_flight(req_id)
        builder = ResultBuilder(req_id, self._core.sent_s(req_id))
        async for _ in self._outputs(req_id, builder):
            pass
        return builder.result

    async def embed(self, /, prompt: str | None = None, *, input_ids: list[int] | None = None) -> np.ndarray:
        """The embedding of one prompt (text or token ids): float32[hidden], pooled and normalised as
        the server's model says (a server started with --task embed; others refuse it)."""
        result = await self.result(await self.submit(prompt, input_ids=input_ids, embed=True, max_tokens=None))
        assert result.embedding is not None, f"req {result.req_id}: the server sent no embedding"
        return result.embedding

    async def generate_batch(self, /, prompts: list[str], **sampling) -> list[GenerateResult]:
        """Every prompt in flight at once; the results in the prompts' order, with `n` each prompt's
        n choices in turn (prompt p's choice i at p * n + i)."""
        return await self.results(await self.submit_all([{"prompt": p} for p in prompts], **sampling))

    async def submit_all(self, /, bodies: list[dict], **sampling) -> list[int]:
        """Client.submit_all: every choice's req_id; if one body cannot be sent, those sent are aborted."""
        req_ids: list[int] = []
        try:
            for body in bodies:
                req_id = await self.submit(**body, **sampling)
                req_ids += range(req_id, req_id + num_copies({**sampling, **body}))  # a body may carry its own n
        except BaseException:
            for req_id in req_ids:
                await self.abort(req_id)
                self._core.forget(req_id)
            raise
        return req_ids

    async def results(self, req_ids: list[int]) -> list[GenerateResult]:
        """Client.results, read concurrently: if one raises, the other reads are cancelled, which
        aborts their requests, before the error is raised."""
        reads = [asyncio.ensure_future(self.result(req_id)) for req_id in req_ids]
        try:
            return list(await asyncio.gather(*reads))
        except BaseException:
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            raise

    async def stream(self, /, prompt: str | None = None, **kwargs) -> AsyncIterator[str]:
        """Text deltas as they come. Leaving the loop early aborts the request once the generator
        is closed: `async with contextlib.aclosing(client.stream(...)) as s:` closes it at once."""
        refuse_copies(kwargs, "stream")
        async with contextlib.aclosing(self.stream_of(await self.submit(prompt, **kwargs))) as deltas:
            async for delta in deltas:
                yield delta

    async def stream_of(self, req_id: int) -> AsyncIterator[str]:
        """The text deltas of a request `submit`ted earlier (outputs that came already first)."""
        self._core.check_in_flight(req_id)
        builder = ResultBuilder(req_id, self._core.sent_s(req_id))
        async with contextlib.aclosing(self._outputs(req_id, builder)) as outputs:
            async for delta in outputs:
                if delta:
                    yield delta

    async def stream_outputs(self, /, prompt: str | None = None, **kwargs) -> AsyncIterator[tuple[str, GenerateResult]]:
        """(delta, result so far) pairs, for callers that want ids, usage and timings as they grow."""
        req_id = await self.submit(prompt, **kwargs)
        builder = ResultBuilder(req_id, self._core.sent_s(req_id))
        async with contextlib.aclosing(self._outputs(req_id, builder)) as outputs:
            async for delta in outputs:
                yield delta, builder.result

    async def stream_outputs_of(self, req_id: int) -> AsyncIterator[tuple[str, GenerateResult]]:
        """(delta, result so far) pairs of a request `submit`ted earlier (a choice of an n > 1 one)."""
        self._core.check_in_flight(req_id)
        builder = ResultBuilder(req_id, self._core.sent_s(req_id))
        async with contextlib.aclosing(self._outputs(req_id, builder)) as outputs:
            async for delta in outputs:
                yield delta, builder.result

    async def abort(self, req_id: int) -> None:
        await self._sock.send(self._core.abort(req_id))

    async def stats(self) -> dict:
        return (await self.stats_out()).as_dict()

    async def stats_out(self) -> StatsOut:
        """The server's stats as typed records (what `stats()` flattens)."""
        self._ensure_started()
        req_id, frame = self._core.stats_request()
        await self._sock.send(frame)
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        try:
            while (stats := self._core.take_stats(req_id)) is None:
                if not await self._arrival(req_id, deadline):
                    raise TimeoutError(f"no stats within {self.timeout_s or 10.0}s")
            return stats
        finally:
            self._core.drop_stats(req_id)

    async def tokenize(self, body: dict[str, Any], add_special_tokens: bool = True) -> TokenizeOut:
        """The server's tokenizer on `body` (ClientCore.tokenize_request): the ids, or for input_ids the text."""
        self._ensure_started()
        req_id, frame = self._core.tokenize_request(body, add_special_tokens)
        await self._sock.send(frame)
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        try:
            while (answer := self._core.take_tokenize(req_id)) is None:
                if not await self._arrival(req_id, deadline):
                    raise TimeoutError(f"no tokenize answer within {self.timeout_s or 10.0}s")
            return answer
        finally:
            self._core.drop_tokenize(req_id)

    async def close(self) -> None:
        for frame in self._core.close():
            await self._sock.send(frame)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watch.close()
        self._sock.close(linger=100)
        self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- plumbing ----------------------------------------------------------------------------

    async def _outputs(self, req_id: int, builder: ResultBuilder) -> AsyncIterator[str]:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            while not builder.done:
                item = self._core.next_output(req_id)  # raises the error fail_all set once the outputs run out
                if item is None:
                    if not await self._arrival(req_id, deadline):
                        raise RequestTimeoutError(f"request {req_id}: no result within {self.timeout_s}s")
                    continue
                arrived_s, out = item
                yield builder.add(out, arrived_s)
        finally:
            if not builder.done and self._core.forget(req_id):
                await self.abort(req_id)

    async def _arrival(self, req_id: int, deadline: float | None) -> bool:
        """Wait until the read loop files something for `req_id` (or fails everything): True; False
        at `deadline`. The waiter is awaited directly, not through asyncio.wait_for, which can
        swallow a cancellation that comes as the waiter completes (the cancelled read would then
        go on, and its request would not be aborted)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiters[req_id] = loop.create_future()
        timer = None if deadline is None else loop.call_later(
            max(0.0, deadline - time.monotonic()), _settle, waiter, False,
        )
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if self._waiters.get(req_id) is waiter:
                del self._waiters[req_id]

    def _wake(self, req_id: int) -> None:
        waiter = self._waiters.pop(req_id, None)
        if waiter is not None:
            _settle(waiter, True)

    async def _read_loop(self) -> None:
        while True:
            req_id = self._core.receive(await self._sock.recv(), time.perf_counter())
            if req_id is not None:
                self._wake(req_id)

    async def _watch_loop(self) -> None:
        """Fail every waiting request once the server's end of the connection closes."""
        while not self._watch.lost:
            self._watch.on_event(await self._watch.monitor.recv_multipart())
        await asyncio.sleep(LOST_GRACE_S)  # let the read loop file what arrived before the close
        self._fail_all(ServerGoneError(lost_message(self.address)))

    def _fail_all(self, error: BaseException) -> None:
        self._core.fail_all(error)
        for req_id in list(self._waiters):
            self._wake(req_id)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._sock.send(self._core.heartbeat())
            await asyncio.sleep(self.heartbeat_interval_s)
            silent_s = self._core.silent_for_s()
            if silent_s > self.server_timeout_s:
                self._fail_all(ServerGoneError(f"server at {self.address} has not answered for {silent_s:.0f}s"))


def _settle(waiter: asyncio.Future[bool], arrived: bool) -> None:
    if not waiter.done():
        waiter.set_result(arrived)
