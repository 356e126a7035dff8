"""The synchronous ZMQ client.

    with Client(port) as c:
        print(c.generate("What is the capital of France?", max_tokens=32).text)
        for delta in c.stream(messages=[{"role": "user", "content": "Hi"}]):
            print(delta, end="", flush=True)

One Client is one ZMQ DEALER socket; it is not thread-safe (use one per thread, or AsyncClient).
Outputs of several requests in flight are demultiplexed by req_id (client_core.py, shared with
AsyncClient: this file is only the blocking I/O around it), so `generate_batch` sends everything
first and then collects. Timings (`ttft_s`, `latency_s`) run from `submit` to when
this client *receives* an output, which for a sync client is when some call reads the socket:
measure concurrent requests with AsyncClient, whose reader task receives as outputs arrive.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import zmq

from zserve.client.client_core import ClientCore
from zserve.client.connection_watch import ConnectionWatch, lost_message
from zserve.client.heartbeat import HeartbeatThread
from zserve.client.request_body import num_copies, refuse_copies
from zserve.client.result_builder import ResultBuilder
from zserve.client.types import GenerateResult, RequestTimeoutError, ServerGoneError, resolve_api_key
from zserve.common.messages import ReqOutput, TokenizeOut
from zserve.common.server_config import DEFAULT_CLIENT_PORT

POLL_MS = 100


def client_address(port_or_address: int | str, host: str = "127.0.0.1") -> str:
    if isinstance(port_or_address, int):
        return f"tcp://{host}:{port_or_address}"
    return port_or_address


class Client:
    def __init__(
        self, port_or_address: int | str = DEFAULT_CLIENT_PORT, *, host: str = "127.0.0.1",
        timeout_s: float | None = None, heartbeat_interval_s: float = 1.0, server_timeout_s: float = 15.0,
        api_key: str | None = None,
    ):
        """`api_key`: the server's --api-key, sent with every request (None = $ZSERVE_API_KEY, "" = none);
        a server with a key refuses a request without it with UnauthorizedError."""
        self.address = client_address(port_or_address, host)
        self.api_key = resolve_api_key(api_key)
        self.timeout_s = timeout_s
        self.server_timeout_s = server_timeout_s
        self._core = ClientCore(api_key=self.api_key)
        self.client_id = self._core.client_id
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._watch = ConnectionWatch(self._sock)  # before connect, so the first CONNECTED event is seen
        self._sock.connect(self.address)
        self._heartbeat = HeartbeatThread(self._ctx, self.address, self.client_id, heartbeat_interval_s, self.api_key)

    # ---- requests ----------------------------------------------------------------------------

    def submit(
        self, /, prompt: str | None = None, *, input_ids: list[int] | None = None, messages: list[dict] | None = None,
        req_id: int | None = None, **sampling,
    ) -> int:
        """Send a request without waiting; returns its req_id, to read back with `result(req_id)`
        or `stream_of(req_id)` (once: a request's outputs are read by one of them). With `n=4`
        the server answers 4 choices of the prompt, computed once: requests req_id .. req_id + 3."""
        req_id, frame = self._core.submit(prompt, input_ids, messages, req_id, sampling)
        self._sock.send(frame)
        return req_id

    def generate(self, /, prompt: str | None = None, **kwargs) -> GenerateResult:
        """One result (n above 1 is refused: see generate_batch)."""
        refuse_copies(kwargs, "generate")
        return self.result(self.submit(prompt, **kwargs))

    def embed(self, /, prompt: str | None = None, *, input_ids: list[int] | None = None) -> np.ndarray:
        """AsyncClient.embed: one prompt's embedding, float32[hidden] (a --task embed server)."""
        result = self.result(self.submit(prompt, input_ids=input_ids, embed=True, max_tokens=None))
        assert result.embedding is not None, f"req {result.req_id}: the server sent no embedding"
        return result.embedding

    def generate_batch(self, /, prompts: list[str], **sampling) -> list[GenerateResult]:
        """Every prompt in flight at once; the results in the prompts' order, with `n` each prompt's
        n choices in turn (prompt p's choice i at p * n + i, as OpenAI numbers choices)."""
        return self.results(self.submit_all([{"prompt": p} for p in prompts], **sampling))

    def submit_all(self, /, bodies: list[dict], **sampling) -> list[int]:
        """Send one request per body ({"prompt": ...}, {"input_ids": ...} or {"messages": ...}) with
        the same sampling (a body may add options of its own, none of sampling's); returns every
        choice's req_id (with `n`, each body's n in turn). If one cannot be sent, those already sent
        are aborted before the error is raised."""
        req_ids: list[int] = []
        try:
            for body in bodies:
                req_id = self.submit(**body, **sampling)
                req_ids += range(req_id, req_id + num_copies({**sampling, **body}))  # a body may carry its own n
        except BaseException:
            self.discard(req_ids)
            raise
        return req_ids

    def results(self, req_ids: list[int]) -> list[GenerateResult]:
        """The whole results of requests submitted earlier, in order. If one raises (the server
        refused it, a timeout), the others are aborted before the error is raised: nothing is left
        running for a reader that will never come."""
        out: list[GenerateResult] = []
        try:
            for req_id in req_ids:
                out.append(self.result(req_id))
        except BaseException:
            self.discard(req_ids[len(out):])
            raise
        return out

    def wait_finished(self, req_ids: Collection[int], timeout_s: float | None = None) -> list[int]:
        """Those of `req_ids` (in flight here; a set or dict, tested with `in`) whose last output
        has arrived, so `result` returns them at once: waits until there is one, or for at most
        `timeout_s` (then the list may be empty). The client's timeout_s does not apply here."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            done = self._core.finished(req_ids)
            if done or (deadline is not None and time.monotonic() >= deadline):
                return done
            self._pump(None)

    def discard(self, req_ids: list[int]) -> None:
        """Abort the requests among `req_ids` still in flight and drop their client state (their
        outputs are never read)."""
        for req_id in req_ids:
            if self._core.forget(req_id):
                self.abort(req_id)

    def stream(self, /, prompt: str | None = None, **kwargs) -> TextStream:
        """Text deltas as they come; `.result` holds the whole result once the stream ends."""
        refuse_copies(kwargs, "stream")
        return TextStream(self, self.submit(prompt, **kwargs))

    def stream_of(self, req_id: int) -> TextStream:
        """The text deltas of a request `submit`ted earlier (outputs that came already first)."""
        self._core.check_in_flight(req_id)
        return TextStream(self, req_id)

    def result(self, req_id: int) -> GenerateResult:
        """The whole result of a request `submit`ted earlier, once it ends."""
        self._core.check_in_flight(req_id)
        builder = ResultBuilder(req_id, self._core.sent_s(req_id))
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while not builder.done:
            arrived_s, out = self._next_output(req_id, deadline)
            builder.add(out, arrived_s)
        return builder.result

    def abort(self, req_id: int) -> None:
        """Ask the server to stop `req_id`; its result ends with finish_reason "abort"."""
        self._sock.send(self._core.abort(req_id))

    def stats(self) -> dict:
        """Server state: waiting, running, KV pages free/cached/used, prefix hit tokens, ..."""
        req_id, frame = self._core.stats_request()
        self._sock.send(frame)
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        try:
            while (stats := self._core.take_stats(req_id)) is None:
                self._pump(deadline)
            return stats.as_dict()
        finally:
            self._core.drop_stats(req_id)

    def tokenize(self, body: dict[str, Any], add_special_tokens: bool = True) -> TokenizeOut:
        """The server's tokenizer on `body` ({"prompt": ...}, {"messages": ...}: the ids a request would
        have; {"input_ids": ...}: their text)."""
        req_id, frame = self._core.tokenize_request(body, add_special_tokens)
        self._sock.send(frame)
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        try:
            while (answer := self._core.take_tokenize(req_id)) is None:
                self._pump(deadline)
            return answer
        finally:
            self._core.drop_tokenize(req_id)

    def close(self) -> None:
        """Abort what is still in flight, stop the heartbeat, close the socket."""
        for frame in self._core.close():
            self._sock.send(frame)
        self._heartbeat.stop()
        self._watch.close()
        self._sock.close(linger=100)
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- plumbing ----------------------------------------------------------------------------

    def _next_output(self, req_id: int, deadline: float | None) -> tuple[float, ReqOutput]:
        """The next output of `req_id` (the last one ends it), reading the socket until it comes."""
        while (item := self._core.next_output(req_id)) is None:
            try:
                self._pump(deadline)
            except RequestTimeoutError:
                self.abort(req_id)
                self._core.forget(req_id)
                raise
        return item

    def _pump(self, deadline: float | None) -> None:
        """Receive whatever arrives within one poll interval and file it by req_id."""
        if deadline is not None and time.monotonic() > deadline:
            raise RequestTimeoutError(f"no result within {self.timeout_s}s")
        if self._heartbeat.silent_for_s() > self.server_timeout_s:
            silent_s = self._heartbeat.silent_for_s()
            raise ServerGoneError(f"server at {self.address} has not answered for {silent_s:.0f}s")
        if self._watch.lost and not self._sock.poll(0):  # seen on an earlier pump, and everything sent before it read
            raise ServerGoneError(lost_message(self.address))
        if self._sock.poll(POLL_MS):
            while self._sock.poll(0):
                self._core.receive(self._sock.recv(), time.perf_counter())
        self._watch.poll()


class TextStream:
    """Iterates text deltas of one request. Leaving the loop early aborts the request."""

    def __init__(self, client: Client, req_id: int):
        self.client = client
        self.req_id = req_id
        self.result: GenerateResult | None = None
        self._gen = self._deltas()

    def __iter__(self) -> Iterator[str]:
        return self._gen

    def __next__(self) -> str:
        return next(self._gen)

    def _deltas(self) -> Iterator[str]:
        builder = ResultBuilder(self.req_id, self.client._core.sent_s(self.req_id))
        deadline = None if self.client.timeout_s is None else time.monotonic() + self.client.timeout_s
        try:
            while not builder.done:
                arrived_s, out = self.client._next_output(self.req_id, deadline)
                delta = builder.add(out, arrived_s)
                if delta:
                    yield delta
            self.result = builder.result
        finally:
            if not builder.done and self.client._core.forget(self.req_id):  # later outputs of this request are dropped
                self.client.abort(self.req_id)

    def close(self) -> None:
        self._gen.close()
