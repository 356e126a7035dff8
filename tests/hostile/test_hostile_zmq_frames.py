"""Hostile raw frames on the client port (a DEALER socket, no Python client in between): a frame
that still reads as a GenerateReq's tag and req_id gets that request's clear error; anything
else is dropped; a normal request next to it is served with its usual output either way."""

from __future__ import annotations

import os
import re

import msgpack
import pytest
import zmq

from testing.hostile import NORMAL_MAX_TOKENS, NORMAL_PROMPT, Neighbour
from zserve.client import Client
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import CLIENT_TO_FRONTEND, FRONTEND_TO_CLIENT, AbortReq, GenerateReq, ReqOutput
from zserve.common.wire import tag_of

TAG = tag_of(GenerateReq)
REQ_ID = 4242


def frame(*fields) -> bytes:
    return msgpack.packb(list(fields))


def gen(body, req_id: int = REQ_ID) -> bytes:
    """A GenerateReq frame: tag, req_id, client id, body, API key (none)."""
    return frame(TAG, req_id, "c", body, "")


ANSWERED = [
    ("body key not a string", gen({1: "x"}), r"malformed request: GenerateReq.body \(a key\): Expected `str`, got `int`"),
    ("sampling key not a string", gen({"prompt": "x", "sampling": {1: 2}}), "unknown sampling field.*1"),
    ("client_id not a string", frame(TAG, REQ_ID, 12345, {"prompt": "x"}, ""), "malformed request"),
    ("fields missing", frame(TAG, REQ_ID), "malformed request"),
    ("fields extra", frame(TAG, REQ_ID, "c", {"prompt": "x"}, "", 1, 2, 3), "malformed request"),
    ("body a list", gen([1, 2, 3]), "malformed request: GenerateReq.body: Expected `map`, got `list`"),
    ("body a string", gen("prompt"), "malformed request: GenerateReq.body: Expected `map`, got `str`"),
    ("top_k = 2**64 - 1", gen({"prompt": "x", "sampling": {"top_k": 2**64 - 1}}), "top_k must be an integer in"),
    ("max_tokens = -2**63", gen({"prompt": "x", "sampling": {"max_tokens": -(2**63)}}), "max_tokens must be"),
    ("input_ids a string", gen({"input_ids": "abc"}), "input_ids must be a list of integers"),
    ("input_ids of floats", gen({"input_ids": [0.5] * 100}), r"input_ids\[0\] must be an integer"),
    ("input_ids of bytes", gen({"input_ids": [b"\x00"]}), r"input_ids\[0\] must be an integer"),
    ("prompt as bytes", gen({"prompt": b"\xff\xfe"}), "prompt must be a string, got bytes"),
    ("sampling a list", gen({"prompt": "x", "sampling": [1]}), "sampling params must be a mapping"),
    ("stop a map", gen({"prompt": "x", "sampling": {"stop": {"a": 1}}}), "stop must be a list"),
    ("messages a map", gen({"messages": {"role": "user"}}), "messages must be a non-empty list"),
    ("message a list", gen({"messages": [["user", "hi"]]}), r"messages\[0\] must be an object"),
]
REQ_ID_OUT_OF_RANGE = [
    ("req_id = 2**64 - 1", 2**64 - 1),
    ("req_id negative", -5),
]
DROPPED = [
    ("random bytes", os.urandom(256)),
    ("empty frame", b""),
    ("truncated msgpack", gen({"prompt": "x" * 100})[:50]),
    ("unknown tag", frame(9999, REQ_ID, "c", {})),
    ("array claiming 4 billion entries", b"\xdd\xff\xff\xff\xff"),
    ("100,000 nested arrays", b"\x91" * 100_000 + b"\x01"),
    ("an ext type", b"\xc7\x05\x01abcde"),
]


@pytest.fixture
def raw_socket(hostile_server):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(hostile_server.address)
    yield sock
    ctx.destroy(linger=0)


def reply(sock: zmq.Socket, timeout_ms: int = 10_000) -> ReqOutput | None:
    if not sock.poll(timeout_ms):
        return None
    msg = FRONTEND_TO_CLIENT.decode(sock.recv())
    assert isinstance(msg, ReqOutput), msg
    return msg


@pytest.mark.parametrize(("name", "data", "needle"), ANSWERED, ids=[c[0] for c in ANSWERED])
def test_malformed_request_frame_gets_its_error(hostile_server, expected, raw_socket, name, data, needle):
    neighbour = Neighbour.start(hostile_server.port, expected)
    raw_socket.send(data)
    out = reply(raw_socket)
    assert out is not None, "no answer to a frame that names its req_id"
    assert out.req_id == REQ_ID and out.finish_reason is FinishReason.ERROR and out.code is ErrorCode.INVALID
    assert re.search(needle, out.error), out.error
    neighbour.assert_served()


@pytest.mark.parametrize(("name", "req_id"), REQ_ID_OUT_OF_RANGE, ids=[c[0] for c in REQ_ID_OUT_OF_RANGE])
def test_req_id_out_of_range_is_refused(hostile_server, expected, raw_socket, name, req_id):
    neighbour = Neighbour.start(hostile_server.port, expected)
    raw_socket.send(gen({"prompt": "hello"}, req_id))
    out = reply(raw_socket)
    assert out is not None and out.req_id == req_id and out.code is ErrorCode.INVALID
    assert "req_id must be in [0, 2**63)" in out.error
    neighbour.assert_served()


@pytest.mark.parametrize(("name", "data"), DROPPED, ids=[c[0] for c in DROPPED])
def test_unreadable_frame_is_dropped(hostile_server, expected, raw_socket, name, data):
    neighbour = Neighbour.start(hostile_server.port, expected)
    raw_socket.send(data)
    raw_socket.send_multipart([b"a", b"b", b"c"])  # and a frame count no message has
    neighbour.assert_served()
    assert reply(raw_socket, timeout_ms=100) is None


def test_abort_of_another_clients_request_is_ignored(hostile_server, expected, raw_socket):
    with Client(hostile_server.port, timeout_s=30) as c:
        req_id = c.submit(NORMAL_PROMPT, max_tokens=NORMAL_MAX_TOKENS, ignore_eos=True)
        raw_socket.send(CLIENT_TO_FRONTEND.encode(AbortReq(req_id=req_id)))  # aborts reach only a request's own client
        result = c.result(req_id)
    assert result.finish_reason == "length" and result.output_ids == expected.output_ids
