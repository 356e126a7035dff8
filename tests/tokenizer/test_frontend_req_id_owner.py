"""A request id belongs to the client whose request holds it: the frontend refuses another
client's request naming it (to that client) and leaves the holder's request untouched, for every
choice id of an `n` request too. Real sockets (inproc), no other process."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from testing.outbox import Outbox
from testing.tokenizer_fixtures import build_byte_level_bpe
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.messages import (
    CLIENT_TO_FRONTEND,
    FRONTEND_INBOX,
    FRONTEND_TO_CLIENT,
    SCHEDULER_INBOX,
    AbortReq,
    GenerateReq,
    ReqOutput,
    TokenizedReq,
)
from zserve.common.transport import pull
from zserve.common.wire import tag_of
from zserve.tokenizer_proc.client_registry import ClientRegistry
from zserve.tokenizer_proc.frontend import Frontend
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

OWNER_ID = 1000


@pytest.fixture(scope="module")
def validator(tmp_path_factory) -> RequestValidator:
    return RequestValidator(TextTokenizer.from_model_dir(build_byte_level_bpe(tmp_path_factory.mktemp("bl"))), 64)


class Door:
    """A Frontend on inproc sockets with two clients, a and b, each its own DEALER."""

    def __init__(self, validator: RequestValidator):
        self.ctx = zmq.Context()
        router = self.ctx.socket(zmq.ROUTER)
        router.bind("inproc://clients")
        inbox = pull(self.ctx, "inproc://frontend-inbox", FRONTEND_INBOX)
        self.to_scheduler = Outbox(SCHEDULER_INBOX)
        self.frontend = Frontend(validator, router, inbox, self.to_scheduler, ClientRegistry(client_timeout_s=60.0))
        self.sockets = {}
        for name in ("a", "b"):
            sock = self.ctx.socket(zmq.DEALER)
            sock.connect("inproc://clients")
            self.sockets[name] = sock

    def send(self, name: str, req_id: int, n: int = 1) -> None:
        body = {"prompt": "Hello", "sampling": {"max_tokens": 4}, **({"n": n} if n > 1 else {})}
        self.send_frame(name, CLIENT_TO_FRONTEND.encode(GenerateReq(req_id=req_id, client_id=name, body=body)))

    def send_frame(self, name: str, frame: bytes) -> None:
        self.sockets[name].send(frame)
        assert self.frontend.router.poll(1000)
        self.frontend.drain_clients()

    def replies(self, name: str) -> list[ReqOutput]:
        sock, got = self.sockets[name], []
        while sock.poll(50):
            got.append(FRONTEND_TO_CLIENT.decode(sock.recv()))
        return got

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture()
def door(validator):
    d = Door(validator)
    yield d
    d.close()


def test_another_clients_request_naming_an_id_in_flight_is_refused_to_it_and_the_owner_serves_on(door):
    door.send("a", OWNER_ID)
    door.send("b", OWNER_ID)
    [refusal] = door.replies("b")
    assert (refusal.req_id, refusal.finish_reason, refusal.code) == (OWNER_ID, FinishReason.ERROR, ErrorCode.INTERNAL)
    assert f"req_id {OWNER_ID} is already in flight for another client's request" in refusal.error
    assert door.replies("a") == []  # the owner hears nothing of it ...
    assert [type(m) for m in door.to_scheduler.sent] == [TokenizedReq]  # ... and only its request went on
    assert door.frontend.registry.owns("a", OWNER_ID)
    door.frontend.route_output(ReqOutput(req_id=OWNER_ID, text="x", token_ids=np.array([5], np.int32)))
    door.frontend.route_output(ReqOutput.final(OWNER_ID, FinishReason.LENGTH))
    assert [(m.req_id, m.finish_reason) for m in door.replies("a")] == [(OWNER_ID, None), (OWNER_ID, FinishReason.LENGTH)]
    assert door.replies("b") == [] and door.frontend.registry.num_in_flight == 0
    door.send("b", OWNER_ID)  # once the owner's request ended, the id is free for anyone
    assert door.replies("b") == [] and door.frontend.registry.owns("b", OWNER_ID)


def test_a_clash_on_any_choice_id_refuses_the_newcomers_every_choice(door):
    door.send("a", OWNER_ID, n=4)  # holds 1000 .. 1003
    door.send("b", OWNER_ID - 2, n=3)  # 998, 999, 1000: its third choice clashes
    door.send("b", OWNER_ID + 3)  # the owner's last choice
    refusals = door.replies("b")
    assert [m.req_id for m in refusals] == [998, 999, 1000, 1003]
    assert all(m.code is ErrorCode.INTERNAL and "in flight for another client's request" in m.error for m in refusals)
    assert "req_id 1000 is already in flight" in refusals[0].error and "req_ids 998 .. 1000 (n=3)" in refusals[0].error
    assert door.replies("a") == [] and [m.num_copies for m in door.to_scheduler.sent] == [4]
    assert sorted(door.frontend.registry.owner_of) == [1000, 1001, 1002, 1003]
    assert set(door.frontend.registry.owner_of.values()) == {"a"}


def test_a_client_reusing_its_own_id_in_flight_is_refused_on_that_id(door):
    """Unchanged: the error can only name the id, which its own request in flight holds too, so it
    reaches that request's stream (zserve's clients refuse this before sending: ClientCore.submit)."""
    door.send("a", OWNER_ID)
    door.send("a", OWNER_ID)
    [refusal] = door.replies("a")
    assert refusal.req_id == OWNER_ID and "already in flight on this client" in refusal.error
    assert [type(m) for m in door.to_scheduler.sent] == [TokenizedReq] and door.frontend.registry.owns("a", OWNER_ID)


def test_an_abort_or_a_malformed_frame_naming_another_clients_id_leaves_its_request_alone(door):
    door.send("a", OWNER_ID)
    door.send_frame("b", CLIENT_TO_FRONTEND.encode(AbortReq(req_id=OWNER_ID)))
    malformed = msgpack.packb([tag_of(GenerateReq), OWNER_ID, "b", [1, 2, 3], ""])  # a body that is no mapping
    door.send_frame("b", malformed)
    [refusal] = door.replies("b")  # the malformed frame's sender is told ...
    assert refusal.req_id == OWNER_ID and refusal.code is ErrorCode.INVALID and "malformed request" in refusal.error
    door.send_frame("a", malformed)  # ... except the id's owner, whose request the error would end
    assert door.replies("a") == [] and [type(m) for m in door.to_scheduler.sent] == [TokenizedReq]


def test_choice_ids_past_the_int64_range_are_the_requests_fault(door):
    door.send("a", 2**63 - 2, n=3)
    refusals = door.replies("a")
    assert len(refusals) == 3 and all(m.code is ErrorCode.INVALID and "runs past 2**63 - 1" in m.error for m in refusals)
    assert door.to_scheduler.sent == []
