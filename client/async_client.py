"""The asyncio ZMQ client (uvloop-friendly).

    async with AsyncClient(port) as c:
        result = await c.generate("Hello", max_tokens=16)
        async for delta in c.stream(messages=[{"role": "user", "content": "Hi"}]):
            ...

One reader task files every output by req_id into that request's queue; one heartbeat task
tells the server this client is alive. Many requests may be in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from zserve.client.client import client_address
from zserve.client.connection_watch import ConnectionWatch, lost_message
from zserve.client.request_body import build_body, encode_request, new_req_id, num_copies, refuse_copies
from zserve.client.result_builder import ResultBuilder
from zserve.client.types import (
    GenerateResult,
    RequestTimeoutError,
    ServerError,
    ServerGoneError,
    resolve_api_key,
    stats_or_raise,
)
from zserve.common.messages import (
    CLIENT_TO_FRONTEND,
    FRONTEND_TO_CLIENT,
    AbortReq,
    GenerateReq,
    Heartbeat,
    HeartbeatAck,
    ReqOutput,
    StatsOut,
    StatsReq,
)
from zserve.common.server_config import DEFAULT_CLIENT_PORT

LOST_GRACE_S = 0.2  # after the connection closes, outputs already received are filed before requests fail


class AsyncClient:
    def __init__(
        self, port_or_address: int | str = DEFAULT_CLIENT_PORT, *, host: str = "127.0.0.1", timeout_s: float | None = None,
        heartbeat_interval_s: float = 1.0, server_timeout_s: float = 15.0, api_key: str | None = None,
        client_id: str | None = None,
    ):
        """`api_key` as for Client: None = $ZSERVE_API_KEY, "" = none. `client_id` names this client
        to the server (default: a random one); one starting with common.messages.PROBE_CLIENT_PREFIX
        marks health probes, which the server counts nowhere."""
        self.address = client_address(port_or_address, host)
        self.api_key = resolve_api_key(api_key)
        self.timeout_s = timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.server_timeout_s = server_timeout_s
        self.client_id = client_id or uuid.uuid4().hex
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._watch = ConnectionWatch(self._sock)  # before connect, so the first CONNECTED event is seen
        self._sock.connect(self.address)
        self._queues: dict[int, asyncio.Queue[ReqOutput | BaseException]] = {}
        self._stats: dict[int, asyncio.Future[dict]] = {}
        self._tasks: list[asyncio.Task] = []
        self._last_ack_s = time.monotonic()

    def _ensure_started(self) -> None:
        if not self._tasks:
            self._last_ack_s = time.monotonic()
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
        req_id = new_req_id() if req_id is None else req_id
        body = build_body(prompt, input_ids, messages, sampling)
        frame = encode_request(GenerateReq(req_id=req_id, client_id=self.client_id, body=body, api_key=self.api_key))
        for copy_id in range(req_id, req_id + num_copies(body)):  # n=4: choices req_id .. req_id + 3
            self._queues[copy_id] = asyncio.Queue()
        await self._sock.send(frame)
        return req_id

    async def generate(self, /, prompt: str | None = None, **kwargs) -> GenerateResult:
        """One result (n above 1 is refused: see generate_batch)."""
        refuse_copies(kwargs, "generate")
        return await self.result(await self.submit(prompt, **kwargs))

    async def result(self, req_id: int) -> GenerateResult:
        """The whole result of a request `submit`ted earlier, once it ends."""
        self._check_in_flight(req_id)
        builder = ResultBuilder(req_id)
        async for _ in self._outputs(req_id, builder):
            pass
        return builder.result

    async def generate_batch(self, /, prompts: list[str], **sampling) -> list[GenerateResult]:
        """Every prompt in flight at once; the results in the prompts' order, with `n` each prompt's
        n choices in turn (prompt p's choice i at p * n + i)."""
        return await self.results(await self.submit_all([{"prompt": p} for p in prompts], **sampling))

    async def submit_all(self, /, bodies: list[dict], **sampling) -> list[int]:
        """Client.submit_all: every choice's req_id; if one body cannot be sent, those sent are aborted."""
        copies = num_copies(sampling)
        req_ids: list[int] = []
        try:
            for body in bodies:
                req_id = await self.submit(**body, **sampling)
                req_ids += range(req_id, req_id + copies)
        except BaseException:
            for req_id in req_ids:
                await self.abort(req_id)
                self._queues.pop(req_id, None)
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
        self._check_in_flight(req_id)
        async with contextlib.aclosing(self._outputs(req_id, ResultBuilder(req_id))) as outputs:
            async for delta in outputs:
                if delta:
                    yield delta

    async def stream_outputs(self, /, prompt: str | None = None, **kwargs) -> AsyncIterator[tuple[str, GenerateResult]]:
        """(delta, result so far) pairs, for callers that want ids, usage and timings as they grow."""
        req_id = await self.submit(prompt, **kwargs)
        builder = ResultBuilder(req_id)
        async with contextlib.aclosing(self._outputs(req_id, builder)) as outputs:
            async for delta in outputs:
                yield delta, builder.result

    async def stream_outputs_of(self, req_id: int) -> AsyncIterator[tuple[str, GenerateResult]]:
        """(delta, result so far) pairs of a request `submit`ted earlier (a choice of an n > 1 one)."""
        self._check_in_flight(req_id)
        builder = ResultBuilder(req_id)
        async with contextlib.aclosing(self._outputs(req_id, builder)) as outputs:
            async for delta in outputs:
                yield delta, builder.result

    async def abort(self, req_id: int) -> None:
        await self._send(AbortReq(req_id=req_id))

    async def stats(self) -> dict:
        self._ensure_started()
        req_id = new_req_id()
        fut = self._stats[req_id] = asyncio.get_running_loop().create_future()
        await self._send(StatsReq(req_id, api_key=self.api_key))
        try:
            return await asyncio.wait_for(fut, self.timeout_s or 10.0)
        finally:
            self._stats.pop(req_id, None)

    async def close(self) -> None:
        for req_id in list(self._queues):
            await self._send(AbortReq(req_id=req_id))
        self._queues.clear()
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

    def _check_in_flight(self, req_id: int) -> None:
        if req_id not in self._queues:
            raise ValueError(f"req_id {req_id} is not in flight on this client: never submitted here, or already read to its end")

    async def _outputs(self, req_id: int, builder: ResultBuilder) -> AsyncIterator[str]:
        queue = self._queues[req_id]
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            while not builder.done:
                left_s = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = await asyncio.wait_for(queue.get(), left_s)
                except asyncio.TimeoutError:
                    raise RequestTimeoutError(f"request {req_id}: no result within {self.timeout_s}s") from None
                if isinstance(item, BaseException):
                    raise item
                yield builder.add(item)
        finally:
            if not builder.done and req_id in self._queues:
                await self.abort(req_id)
            self._queues.pop(req_id, None)

    async def _send(self, msg) -> None:
        await self._sock.send(CLIENT_TO_FRONTEND.encode(msg))

    async def _read_loop(self) -> None:
        while True:
            msg = FRONTEND_TO_CLIENT.decode(await self._sock.recv())
            if isinstance(msg, ReqOutput):
                queue = self._queues.get(msg.req_id)
                if queue is not None:
                    queue.put_nowait(msg)
            elif isinstance(msg, StatsOut):
                fut = self._stats.get(msg.req_id)
                if fut is not None and not fut.done():
                    try:
                        fut.set_result(stats_or_raise(msg))
                    except ServerError as exc:
                        fut.set_exception(exc)
            elif isinstance(msg, HeartbeatAck):
                self._last_ack_s = time.monotonic()

    async def _watch_loop(self) -> None:
        """Fail every waiting request once the server's end of the connection closes."""
        while not self._watch.lost:
            self._watch.on_event(await self._watch.monitor.recv_multipart())
        await asyncio.sleep(LOST_GRACE_S)  # let the read loop file what arrived before the close
        self._fail_all(ServerGoneError(lost_message(self.address)))

    def _fail_all(self, error: BaseException) -> None:
        for queue in self._queues.values():
            queue.put_nowait(error)
        for fut in self._stats.values():
            if not fut.done():
                fut.set_exception(error)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._send(Heartbeat(self.client_id, self.api_key))
            await asyncio.sleep(self.heartbeat_interval_s)
            silent_s = time.monotonic() - self._last_ack_s
            if silent_s > self.server_timeout_s:
                self._fail_all(ServerGoneError(f"server at {self.address} has not answered for {silent_s:.0f}s"))
