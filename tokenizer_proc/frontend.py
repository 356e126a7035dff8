"""The tokenizer process, which is also the server's front door.

It owns the client port (a ROUTER socket): it validates and tokenizes requests, forwards them
to the scheduler, and routes every output the detokenizer produces back to the client that
asked. Because every result passes through here, this process can also end every in-flight
request at once (launcher's FailAll on shutdown or on a dead child) and abort the requests of
a client that went silent.

With an API key (--api-key), a GenerateReq, Heartbeat or StatsReq that does not carry it is
refused (ErrorCode.UNAUTHORIZED to that request) before anything reads it; a Heartbeat without it
is acknowledged (liveness is no secret: HTTP /health is open too) but keeps nothing alive. An
AbortReq needs no key: it stops only requests its own connection sent, which had the key.

    loop:
        wait for a client frame or an inbox message (or the heartbeat tick)
        client: wrong API key -> UNAUTHORIZED to that request
                GenerateReq -> validate, encode, forward | error to that client (an id that any
                               client's request holds: the sender is refused, the holder untouched)
                AbortReq -> forward if the client owns it;  Heartbeat -> ack;  StatsReq -> forward;
                TokenizeReq -> answered here (tokenize_answer.py)
        inbox:  ReqOutput -> route to its client;  FailAll -> end everything in flight, admit nothing more
                AbortReq (the detokenizer ended a request: a stop string, or it failed) -> to the
                         scheduler, ahead of the final output that frees the id, so that a client
                         reusing the id at once reaches the scheduler after the abort
        tick:   abort the requests of silent clients
"""

from __future__ import annotations

import hmac
import logging
import time

import msgpack
import numpy as np
import zmq

from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import (
    CLIENT_TO_FRONTEND,
    FRONTEND_TO_CLIENT,
    AbortReq,
    Drain,
    DrainDone,
    FailAll,
    FrontendStats,
    GenerateReq,
    Heartbeat,
    HeartbeatAck,
    ReqOutput,
    StatsOut,
    StatsReq,
    TokenizedReq,
    TokenizeOut,
    TokenizeReq,
)
from zserve.common.transport import Endpoint
from zserve.common.wire import WireError, tag_of
from zserve.tokenizer_proc.client_registry import ClientRegistry
from zserve.tokenizer_proc.request_metrics import RequestMetrics
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.tokenize_answer import answer_tokenize

logger = logging.getLogger("tokenizer_proc")
TICK_MS = 250
MAX_REQ_ID = 2**63 - 1  # req_ids travel as int64 (the scheduler's tables, numpy arrays)


class Frontend:
    def __init__(
        self, validator: RequestValidator, router: zmq.Socket, inbox: Endpoint, to_scheduler: Endpoint,
        registry: ClientRegistry, api_key: str = "", to_launcher: Endpoint | None = None,
        server_info: dict[str, str] | None = None,
    ):
        self.server_info = dict(server_info or {})  # what StatsOut.info says (model_path)
        self.api_key = api_key.encode()  # b"" = no key: every client is served
        self.to_launcher = to_launcher  # DrainDone goes there
        self.draining: Drain | None = None  # set by the launcher's Drain: no new request is admitted
        self.num_draining = 0  # requests in flight when the drain began
        # set by the launcher's FailAll (stopping, or a process died): every request it ended freed its id at once,
        # while that request's last outputs may still be on their way here, so no new request is admitted (one
        # reusing an id would be handed the old request's late output)
        self.failed: FailAll | None = None
        self.validator = validator
        self.router = router
        self.inbox = inbox
        self.to_scheduler = to_scheduler
        self.registry = registry
        self.metrics = RequestMetrics()
        self.stats_waiters: dict[int, bytes] = {}
        self.poller = zmq.Poller()
        self.poller.register(router, zmq.POLLIN)
        self.poller.register(inbox.socket, zmq.POLLIN)

    def run_forever(self) -> None:
        while True:
            events = dict(self.poller.poll(TICK_MS))
            if self.router in events:
                self.drain_clients()
            if self.inbox.socket in events:
                self.drain_inbox()
            self.abort_silent_clients()
            self.report_drained()

    # ---- from clients ----------------------------------------------------------------------

    def drain_clients(self) -> None:
        while self.router.poll(0):
            frames = self.router.recv_multipart()
            if len(frames) != 2:
                logger.warning("dropped a client message of %d frames (expected 2)", len(frames))
                continue
            identity, frame = frames
            try:
                msg = CLIENT_TO_FRONTEND.decode(frame)
            except WireError as exc:
                self.refuse_malformed(identity, frame, exc)
                continue
            try:
                self.on_client_message(identity, msg)
            except Exception:  # one client's message must never take the front door down
                logger.exception("handling a %s from a client failed; the message is dropped", type(msg).__name__)

    def refuse_malformed(self, identity: bytes, frame: bytes, exc: WireError) -> None:
        """A frame that is not a valid message is dropped; when it still reads as a GenerateReq's
        tag and req_id, its sender gets the reason as that request's error instead of silence (unless
        that id is one of the sender's own requests in flight, which the error would end)."""
        logger.warning("dropped a malformed client frame (%d bytes): %s", len(frame), exc)
        try:
            fields = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.ExtraData, RecursionError):
            return
        if (
            isinstance(fields, list) and len(fields) >= 2 and fields[0] == tag_of(GenerateReq)
            and isinstance(fields[1], int)
        ):
            req_id = fields[1]
            if -(2**63) <= req_id < 2**64 and self.registry.identity_of(req_id) != identity:
                self.refuse(identity, req_id, ErrorCode.INVALID, f"malformed request: {exc}")

    def on_client_message(self, identity: bytes, msg) -> None:
        now_s = time.monotonic()
        if not isinstance(msg, AbortReq) and not self.key_matches(msg.api_key):
            self.refuse_unauthorized(identity, msg)
        elif isinstance(msg, GenerateReq):
            self.on_generate(identity, msg, now_s)
        elif isinstance(msg, AbortReq):
            if self.registry.identity_of(msg.req_id) == identity:
                self.to_scheduler.send(AbortReq(req_id=msg.req_id))  # ABORT, whatever the client said
        elif isinstance(msg, Heartbeat):
            self.registry.heard_from(msg.client_id, now_s)
            self.send_to(identity, HeartbeatAck(client_id=msg.client_id))
        elif isinstance(msg, StatsReq):
            self.stats_waiters[msg.req_id] = identity
            self.to_scheduler.send(StatsReq(req_id=msg.req_id))  # the key stays here
        elif isinstance(msg, TokenizeReq):
            self.send_to(identity, answer_tokenize(self.validator, msg))

    def key_matches(self, presented: str) -> bool:
        return not self.api_key or hmac.compare_digest(presented.encode(), self.api_key)

    def refuse_unauthorized(self, identity: bytes, msg: GenerateReq | Heartbeat | StatsReq | TokenizeReq) -> None:
        error = (
            "missing or wrong API key: this server needs the key it was started with "
            "(Client(api_key=...) or $ZSERVE_API_KEY)"
        )
        if isinstance(msg, GenerateReq):
            logger.info("req %d refused: missing or wrong API key", msg.req_id)
            self.refuse(identity, msg.req_id, ErrorCode.UNAUTHORIZED, error)
        elif isinstance(msg, StatsReq):
            self.send_to(identity, StatsOut(req_id=msg.req_id, code=ErrorCode.UNAUTHORIZED, error=error))
        elif isinstance(msg, TokenizeReq):
            self.send_to(identity, TokenizeOut(req_id=msg.req_id, code=ErrorCode.UNAUTHORIZED, error=error))
        else:  # a Heartbeat: answered, so the client's liveness check holds, but not counted
            self.send_to(identity, HeartbeatAck(client_id=msg.client_id))

    def on_generate(self, identity: bytes, msg: GenerateReq, now_s: float) -> None:
        """Validate and forward a request; one with `n` copies is requests req_id .. req_id + n - 1
        to its client, sent to the scheduler as one message so that it admits them together."""
        if not 0 <= msg.req_id <= MAX_REQ_ID:
            self.refuse(identity, msg.req_id, ErrorCode.INVALID, f"req_id must be in [0, 2**63), got {msg.req_id}")
            return
        try:
            num_copies = self.validator.num_copies(msg.body) if isinstance(msg.body, dict) else 1
        except ValueError as exc:
            self.refuse(identity, msg.req_id, ErrorCode.INVALID, str(exc))
            return
        req_ids = range(msg.req_id, msg.req_id + num_copies)
        if req_ids[-1] > MAX_REQ_ID:
            self.refuse_all(
                identity, req_ids, ErrorCode.INVALID,
                f"req_id {msg.req_id} with n={num_copies} runs past 2**63 - 1 (choice i is req_id + i)",
            )
            return
        clash = self.registry.clash_error(msg.client_id, req_ids)
        if clash is not None:  # the id's owner serves on, untouched: only the sender hears of it
            logger.info("req %d refused: %s", msg.req_id, clash)
            self.refuse_all(identity, req_ids, ErrorCode.INTERNAL, clash)
            return
        if self.failed is not None:
            logger.info("req %d refused: the server is stopping", msg.req_id)
            code = self.failed.code if self.failed.code is not None else ErrorCode.SHUTTING_DOWN
            self.refuse_all(identity, req_ids, code, f"server stopping: {self.failed.error or 'shutdown'}")
            return
        if self.draining is not None:
            logger.info("req %d refused: the server is shutting down", msg.req_id)
            self.refuse_all(
                identity, req_ids, ErrorCode.SHUTTING_DOWN,
                "server shutting down: it finishes the requests it has and takes no new one",
            )
            return
        try:
            input_ids, params = self.validator.validate(msg.body)
        except ValueError as exc:
            logger.info("req %d refused: %s", msg.req_id, exc)
            self.refuse_all(identity, req_ids, ErrorCode.INVALID, str(exc))
            return
        except Exception as exc:  # a bug or a tokenizer failure on this request: it fails, the frontend serves on
            logger.exception("req %d: validating and tokenizing failed", msg.req_id)
            error = f"the server failed to validate or tokenize this request: {type(exc).__name__}: {exc}"
            self.refuse_all(identity, req_ids, ErrorCode.INTERNAL, error)
            return
        for req_id in req_ids:
            self.registry.add_request(msg.client_id, identity, req_id, now_s)
            self.metrics.on_admitted(req_id, msg.client_id, now_s)
        self.to_scheduler.send(TokenizedReq(
            req_id=msg.req_id, input_ids=np.asarray(input_ids, np.int32), params=params, num_copies=num_copies,
        ))

    def refuse_all(self, identity: bytes, req_ids: range, code: ErrorCode, error: str) -> None:
        for req_id in req_ids:
            self.refuse(identity, req_id, code, error)

    def refuse(self, identity: bytes, req_id: int, code: ErrorCode, error: str) -> None:
        self.metrics.on_refused(code)
        self.send_to(identity, ReqOutput.final(req_id, FinishReason.ERROR, code=code, error=error))

    # ---- from the detokenizer and the launcher -----------------------------------------------

    def drain_inbox(self) -> None:
        msg = self.inbox.recv_nowait()
        while msg is not None:
            if isinstance(msg, ReqOutput):
                self.route_output(msg)
            elif isinstance(msg, AbortReq):
                self.pass_abort(msg)
            elif isinstance(msg, StatsOut):
                identity = self.stats_waiters.pop(msg.req_id, None)
                if identity is not None:
                    self.add_frontend_stats(msg)
                    self.send_to(identity, msg)
            elif isinstance(msg, FailAll):
                self.fail_all(msg)
            elif isinstance(msg, Drain):
                self.start_drain(msg)
            msg = self.inbox.recv_nowait()

    def add_frontend_stats(self, msg: StatsOut) -> None:
        msg.frontend = FrontendStats(
            num_in_flight=self.registry.num_in_flight, is_draining=self.draining is not None,
            num_finished=dict(self.metrics.finished), num_errors=dict(self.metrics.errors),
        )
        msg.histograms.update(self.metrics.histograms)
        msg.info.update(self.server_info)

    def route_output(self, out: ReqOutput) -> None:
        identity = self.registry.identity_of(out.req_id)
        if identity is None:
            return  # its client was told already (FailAll) or never existed
        self.metrics.on_output(out, time.monotonic())
        self.send_to(identity, out)
        if out.finish_reason is not None:
            self.registry.finish(out.req_id)

    def pass_abort(self, msg: AbortReq) -> None:
        """The detokenizer ended the request (its final output comes next on the same pipe): the scheduler
        stops it, on this process's one pipe into it, before the output frees the id. An id no longer in
        flight here was ended already (FailAll told the scheduler) and may be another request's now."""
        if self.registry.identity_of(msg.req_id) is not None:
            self.to_scheduler.send(msg)

    def start_drain(self, msg: Drain) -> None:
        self.draining = msg
        self.num_draining = self.registry.num_in_flight
        logger.info(
            "draining: %d request(s) in flight finish (up to %gs); new ones are refused",
            self.num_draining, msg.timeout_s,
        )

    def report_drained(self) -> None:
        """Once draining and nothing is in flight, tell the launcher (once)."""
        if self.draining is None or self.registry.num_in_flight or self.to_launcher is None:
            return
        logger.info("drained: the %d request(s) in flight have finished", self.num_draining)
        self.to_launcher.send(DrainDone(num_drained=self.num_draining))
        self.to_launcher = None

    def fail_all(self, msg: FailAll) -> None:
        self.failed = msg
        req_ids = list(self.registry.owner_of)
        logger.info("ending %d in-flight request(s): %s %s", len(req_ids), msg.finish_reason.text, msg.error or "")
        for req_id in req_ids:
            self.route_output(ReqOutput.final(req_id, msg.finish_reason, code=msg.code, error=msg.error))
            self.to_scheduler.send(AbortReq(req_id=req_id))

    def abort_silent_clients(self) -> None:
        for req_id in self.registry.silent_requests(time.monotonic()):
            logger.info("req %d: client silent for over %.1fs, aborting", req_id, self.registry.client_timeout_s)
            self.to_scheduler.send(AbortReq(req_id=req_id))

    def send_to(self, identity: bytes, msg) -> None:
        self.router.send_multipart([identity, FRONTEND_TO_CLIENT.encode(msg)])
