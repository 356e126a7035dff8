"""Every message on every zserve socket, and the set each socket carries.

Messages are dataclasses whose fields are msgpack-native (int, float, str, bytes, bool, None,
list, dict). Token ids travel as raw int32 bytes (`ids_to_bytes` / `bytes_to_ids`). Each socket
decodes with its own `Codec` listing exactly the messages it carries (bottom of this file).

Sockets (all PUSH/PULL over ipc:// in a private runtime directory, except the client port):

    client  <-> frontend     ROUTER (tcp, --host/--port)  GenerateReq AbortReq Heartbeat StatsReq | ReqOutput StatsOut HeartbeatAck
    frontend -> scheduler    inbox                        TokenizedReq AbortReq StatsReq
    detok   -> scheduler     inbox                        AbortReq (a stop string matched)
    scheduler -> detok                                    DetokRegister TokenOutBatch StatsOut
    detok   -> frontend                                   ReqOutput StatsOut
    scheduler <-> worker                                  ForwardBatchMsg | StepResultMsg WorkerReady WorkerError
    rank 0  -> other TP ranks  XPUB/SUB (ipc, or tcp     ForwardBatchMsg (the scheduler's frame, re-sent) RankHeartbeat RankStop
                               across nodes)
    children -> launcher     control                      ProcReady
    launcher -> frontend     control                      FailAll
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from common.batch_messages import ForwardBatchMsg, StepResultMsg
from common.wire import Codec


def ids_to_bytes(ids: Any) -> bytes:
    return np.asarray(ids, dtype=np.int32).tobytes()


def bytes_to_ids(raw: bytes) -> list[int]:
    return np.frombuffer(raw, dtype=np.int32).tolist()


_WIRE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
    "dict": (dict,),
    "list": (list,),
}


def _field_check(annotation: str) -> tuple[tuple[type, ...], bool]:
    """('int | None') -> ((int,), True): the accepted types and whether None is allowed."""
    parts = [p.strip() for p in annotation.split("|")]
    allow_none = "None" in parts
    types = tuple(t for p in parts if p != "None" for t in _WIRE_TYPES[p])
    return types, allow_none


def message(tag: int):
    """Class decorator: a dataclass sent as `[tag, *fields in declaration order]`.
    Decoding checks each field's type, so a forged frame fails in `Codec.decode`, not deep inside a process."""

    def wrap(cls):
        cls = dataclass(slots=True)(cls)
        names = tuple(f.name for f in fields(cls))
        checks = tuple(_field_check(f.type) for f in fields(cls))
        cls.TAG = tag

        def to_wire(self) -> list[Any]:
            return [getattr(self, n) for n in names]

        def from_wire(klass, values: list[Any]):
            if len(values) != len(names):
                raise ValueError(f"{klass.__name__} takes {len(names)} fields, got {len(values)}")
            for name, value, (types, allow_none) in zip(names, values, checks, strict=True):
                if value is None and allow_none:
                    continue
                if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                    raise TypeError(f"{klass.__name__}.{name} must be {types[0].__name__}, got {type(value).__name__}")
            return klass(*values)

        cls.to_wire = to_wire
        cls.from_wire = classmethod(from_wire)
        return cls

    return wrap


# ---- client <-> frontend -------------------------------------------------------------------


@message(10)
class GenerateReq:
    """`body` is the client's request as sent: exactly one of prompt / input_ids / messages,
    plus `sampling` (SamplingParams fields). It is validated in the frontend, not trusted."""

    req_id: int
    client_id: str
    body: dict


@message(11)
class AbortReq:
    req_id: int
    reason: str = "abort"


@message(12)
class Heartbeat:
    client_id: str


@message(13)
class HeartbeatAck:
    client_id: str


@message(14)
class StatsReq:
    req_id: int


@message(15)
class StatsOut:
    req_id: int
    stats: dict


@message(16)
class ReqOutput:
    """One streamed piece of a request's result. The last one has `finish_reason` set
    ("stop", "length", "abort" or "error"; `error` holds the message for "error")."""

    req_id: int
    text: str
    token_ids: bytes  # int32, the tokens behind `text` and any held-back text
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list | None = None
    max_tokens_clamped_to: int | None = None  # set once, when the context length cut max_tokens


# ---- frontend -> scheduler -----------------------------------------------------------------


@message(20)
class TokenizedReq:
    req_id: int
    input_ids: bytes  # int32
    sampling: dict  # SamplingParams.to_dict()


# ---- scheduler -> detokenizer --------------------------------------------------------------


@message(30)
class DetokRegister:
    """Sent when the scheduler accepts a request, before any of its tokens (same socket, so ordered)."""

    req_id: int
    stop: list
    num_prompt_tokens: int


@message(31)
class TokenOutBatch:
    """One entry per request that changed in a step: [req_id, token_ids (int32 bytes),
    finish_reason | None, error | None, num_prompt_tokens, num_cached_tokens, logprobs | None,
    max_tokens_clamped_to | None]."""

    entries: list


# ---- model worker -> scheduler --------------------------------------------------------------


@message(40)
class WorkerReady:
    num_pages: int
    page_size: int
    context_len: int
    eos_token_ids: list
    vocab_size: int


@message(41)
class WorkerError:
    step_id: int
    message: str


# ---- rank 0 -> other tensor-parallel ranks ---------------------------------------------------


@message(60)
class RankHeartbeat:
    """Rank 0 is alive and idle; a follower that hears nothing for a while exits."""

    step_id: int  # the last step rank 0 broadcast (0 before the first)


@message(61)
class RankStop:
    """Rank 0 is stopping: followers exit, with code 0 when `error` is None (the server stopped)."""

    error: str | None = None


# ---- control -------------------------------------------------------------------------------


@message(50)
class ProcReady:
    name: str
    pid: int
    info: dict


@message(51)
class FailAll:
    """Launcher -> frontend: end every in-flight request with this outcome."""

    finish_reason: str
    error: str | None


CLIENT_TO_FRONTEND = Codec(GenerateReq, AbortReq, Heartbeat, StatsReq)
FRONTEND_TO_CLIENT = Codec(ReqOutput, StatsOut, HeartbeatAck)
SCHEDULER_INBOX = Codec(TokenizedReq, AbortReq, StatsReq)
DETOK_INBOX = Codec(DetokRegister, TokenOutBatch, StatsOut)
FRONTEND_INBOX = Codec(ReqOutput, StatsOut, FailAll)
WORKER_INBOX = Codec(ForwardBatchMsg)
WORKER_TO_SCHEDULER = Codec(StepResultMsg, WorkerReady, WorkerError)
RANK_BROADCAST = Codec(ForwardBatchMsg, RankHeartbeat, RankStop)
LAUNCHER_INBOX = Codec(ProcReady)
