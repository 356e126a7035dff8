"""ClientCore: what both clients do with frames, without sockets, threads or asyncio (sans-I/O).

    core = ClientCore(client_id, api_key)
    req_id, frame = core.submit(prompt="Hi", sampling={"max_tokens": 8}, now_s=time.perf_counter())
    sock.send(frame)                               # the I/O is the caller's: Client or AsyncClient
    core.receive(sock.recv(), time.perf_counter())  # files the output under its req_id
    arrived_s, out = core.next_output(req_id)      # None until one came

It builds the frames a client sends (requests, aborts, stats requests, heartbeats), assigns
request ids, tracks the requests in flight, and files every received frame: an output in its
request's queue, a stats answer under its req_id, a heartbeat ack as the time of the last one.
Client (client.py) wraps it with a blocking socket, AsyncClient (async_client.py) with asyncio.

Contract: a request is in flight from `submit` until its last output is read (`next_output`
returns it) or it is `forget`-ten; a request with `n` choices is n requests, req_id .. req_id +
n - 1 (common/choices.py). Outputs for a request not in flight are dropped. After `fail_all`, a
request then in flight raises its error once its queue is empty: the outputs that came first are read first.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from zserve.client.request_body import build_body, encode_request, new_req_id, num_copies
from zserve.client.types import InvalidRequestError, server_error, stats_or_raise
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
    TokenizeOut,
    TokenizeReq,
)


@dataclass(slots=True)
class InFlight:
    """One request (one choice) this client sent and has not read to its end."""

    sent_s: float  # time.perf_counter() at submit
    outputs: deque[tuple[float, ReqOutput]] = field(default_factory=deque)  # (arrival perf_counter, output), unread
    error: BaseException | None = None  # set by fail_all: raised once `outputs` runs out


class ClientCore:
    def __init__(self, client_id: str | None = None, api_key: str = ""):
        self.client_id = client_id or uuid.uuid4().hex
        self.api_key = api_key
        self.requests: dict[int, InFlight] = {}
        self.finished_ids: set[int] = set()  # in flight, with their last output among their unread ones
        # stats requests sent -> answer, once it came
        self.stats_answers: dict[int, StatsOut | BaseException | None] = {}
        # tokenize requests sent -> answer, once it came
        self.tokenize_answers: dict[int, TokenizeOut | BaseException | None] = {}
        self.last_ack_s = time.monotonic()  # when the server last answered a heartbeat

    # ---- frames out -----------------------------------------------------------------------------

    def submit(
        self, prompt: str | None = None, input_ids: list[int] | None = None, messages: list[dict] | None = None,
        req_id: int | None = None, sampling: dict[str, Any] | None = None, now_s: float | None = None,
    ) -> tuple[int, bytes]:
        """A request's id and frame; its choices (req_id .. req_id + n - 1) are in flight from now
        (`now_s`, a perf_counter time: what the result's timings count from). Raises before
        anything is tracked when the body is wrong or cannot be sent, or when a given `req_id`
        (or a choice's id) is in flight here: the server would refuse it on that id, which is
        also the request in flight's, and end that one in the client's eyes."""
        body = build_body(prompt, input_ids, messages, sampling or {})
        copies = num_copies(body)
        if req_id is None:
            req_id = new_req_id()
            while any(r in self.requests for r in range(req_id, req_id + copies)):  # 62 random bits: ~never
                req_id = new_req_id()
        else:
            self.refuse_in_flight(req_id, copies)
        frame = encode_request(GenerateReq(req_id=req_id, client_id=self.client_id, body=body, api_key=self.api_key))
        sent_s = time.perf_counter() if now_s is None else now_s
        for copy_id in range(req_id, req_id + copies):  # n=4: choices req_id .. req_id + 3
            self.requests[copy_id] = InFlight(sent_s)
        return req_id, frame

    def refuse_in_flight(self, req_id: int, copies: int) -> None:
        clash = next((r for r in range(req_id, req_id + copies) if r in self.requests), None)
        if clash is not None:
            raise InvalidRequestError(
                f"req_id {clash} is already in flight on this client: a request keeps its id until its last output "
                "is read (or it is aborted); give another req_id, or none (a fresh one is drawn)"
            )

    def abort(self, req_id: int) -> bytes:
        return CLIENT_TO_FRONTEND.encode(AbortReq(req_id=req_id))

    def stats_request(self) -> tuple[int, bytes]:
        req_id = new_req_id()
        self.stats_answers[req_id] = None
        return req_id, CLIENT_TO_FRONTEND.encode(StatsReq(req_id, api_key=self.api_key))

    def tokenize_request(self, body: dict[str, Any], add_special_tokens: bool = True) -> tuple[int, bytes]:
        """`body`: {"prompt": str}, {"messages": [...], "tools"?: [...]} (to encode) or {"input_ids": [...]}."""
        req_id = new_req_id()
        self.tokenize_answers[req_id] = None
        return req_id, CLIENT_TO_FRONTEND.encode(TokenizeReq(req_id, body, add_special_tokens, self.api_key))

    def heartbeat(self) -> bytes:
        return CLIENT_TO_FRONTEND.encode(Heartbeat(self.client_id, self.api_key))

    def close(self) -> list[bytes]:
        """Forget everything; returns an abort frame for each request still in flight."""
        frames = [self.abort(req_id) for req_id in self.requests]
        self.requests.clear()
        self.finished_ids.clear()
        self.stats_answers.clear()
        self.tokenize_answers.clear()
        return frames

    # ---- frames in ------------------------------------------------------------------------------

    def receive(self, frame: bytes, now_s: float | None = None) -> int | None:
        """File one frame from the server (received at perf_counter `now_s`); returns the req_id it
        was for when it concerns a request in flight or a stats request waiting (else None)."""
        msg = FRONTEND_TO_CLIENT.decode(frame)
        if isinstance(msg, ReqOutput):
            request = self.requests.get(msg.req_id)
            if request is None:
                return None  # read to its end, aborted or forgotten: dropped
            request.outputs.append((time.perf_counter() if now_s is None else now_s, msg))
            if msg.finish_reason is not None:
                self.finished_ids.add(msg.req_id)
            return msg.req_id
        if isinstance(msg, StatsOut):
            if msg.req_id not in self.stats_answers or self.stats_answers[msg.req_id] is not None:
                return None
            self.stats_answers[msg.req_id] = msg
            return msg.req_id
        if isinstance(msg, TokenizeOut):
            if self.tokenize_answers.get(msg.req_id, False) is not None:
                return None  # not asked, or already answered
            self.tokenize_answers[msg.req_id] = msg
            return msg.req_id
        if isinstance(msg, HeartbeatAck):
            self.last_ack_s = time.monotonic()
        return None

    def fail_all(self, error: BaseException) -> None:
        """The server is gone: each request in flight now raises `error` once its outputs that came
        are read, and each stats request waiting raises it (requests sent later are not failed)."""
        for request in self.requests.values():
            request.error = error
        for answers in (self.stats_answers, self.tokenize_answers):
            for req_id, answer in answers.items():
                if answer is None:
                    answers[req_id] = error

    # ---- reading --------------------------------------------------------------------------------

    def check_in_flight(self, req_id: int) -> None:
        if req_id not in self.requests:
            raise ValueError(
                f"req_id {req_id} is not in flight on this client: never submitted here, or already read to its end"
            )

    def sent_s(self, req_id: int) -> float | None:
        request = self.requests.get(req_id)
        return None if request is None else request.sent_s

    def next_output(self, req_id: int) -> tuple[float, ReqOutput] | None:
        """The oldest unread output of `req_id` (a request in flight), or None while none came. The
        last one ends the request (it is forgotten); raises `fail_all`'s error once the queue is empty."""
        request = self.requests[req_id]
        if not request.outputs:
            if request.error is not None:
                raise request.error
            return None
        arrived_s, out = request.outputs.popleft()
        if out.finish_reason is not None:
            self.forget(req_id)
        return arrived_s, out

    def finished(self, req_ids: Collection[int]) -> list[int]:
        """Those of `req_ids` in flight whose last output has arrived (read at once by `next_output`)."""
        return [req_id for req_id in self.finished_ids if req_id in req_ids]

    def forget(self, req_id: int) -> bool:
        """Drop a request's state (its later outputs are dropped); False when it was not in flight."""
        self.finished_ids.discard(req_id)
        return self.requests.pop(req_id, None) is not None

    def take_stats(self, req_id: int) -> StatsOut | None:
        """The stats answer to `stats_request`'s req_id once it came (then forgotten), else None;
        ServerError when the server refused it."""
        answer = self.stats_answers.get(req_id)
        if answer is None:
            return None
        del self.stats_answers[req_id]
        if isinstance(answer, BaseException):
            raise answer
        return stats_or_raise(answer)

    def drop_stats(self, req_id: int) -> None:
        self.stats_answers.pop(req_id, None)

    def take_tokenize(self, req_id: int) -> TokenizeOut | None:
        """The answer to `tokenize_request`'s req_id once it came (then forgotten), else None; ServerError
        when the server refused it."""
        answer = self.tokenize_answers.get(req_id)
        if answer is None:
            return None
        del self.tokenize_answers[req_id]
        if isinstance(answer, BaseException):
            raise answer
        if answer.code is not None:
            raise server_error(answer.error or "tokenize refused", answer.code)
        return answer

    def drop_tokenize(self, req_id: int) -> None:
        self.tokenize_answers.pop(req_id, None)

    def silent_for_s(self) -> float:
        """Seconds since the server last answered a heartbeat (or since this core began)."""
        return time.monotonic() - self.last_ack_s
