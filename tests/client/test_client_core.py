"""ClientCore, the clients' sans-I/O core: frames in and out, request ids, requests in flight,
outputs filed and read in order, errors raised where they belong. No sockets, no server."""

from __future__ import annotations

import numpy as np
import pytest

from zserve.client.client_core import ClientCore
from zserve.client.result_builder import ResultBuilder
from zserve.client.types import InvalidRequestError, ServerBusyError, ServerGoneError, UnauthorizedError
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
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
from zserve.common.scheduler_stats import SchedulerStats


def output(req_id: int, text: str, ids: list[int], finish: FinishReason | None = None, **extra) -> bytes:
    out = ReqOutput(req_id=req_id, text=text, token_ids=np.asarray(ids, np.int32), finish_reason=finish, **extra)
    return FRONTEND_TO_CLIENT.encode(out)


def test_submit_builds_the_request_frame_and_tracks_each_choice():
    core = ClientCore("client-a", api_key="key")
    req_id, frame = core.submit(prompt="Hi", sampling={"n": 3, "temperature": 0.5}, now_s=1.0)
    msg = CLIENT_TO_FRONTEND.decode(frame)
    assert isinstance(msg, GenerateReq)
    assert (msg.req_id, msg.client_id, msg.api_key) == (req_id, "client-a", "key")
    assert msg.body == {"prompt": "Hi", "n": 3, "sampling": {"max_tokens": 128, "temperature": 0.5}}
    assert set(core.requests) == {req_id, req_id + 1, req_id + 2}  # n=3: choices req_id .. req_id + 2
    assert core.sent_s(req_id + 2) == 1.0
    given_id, _ = core.submit(input_ids=[1, 2], req_id=42)
    assert given_id == 42 and 42 in core.requests


def test_a_body_that_cannot_be_sent_is_refused_before_anything_is_tracked():
    core = ClientCore()
    with pytest.raises(ValueError, match="exactly one of"):
        core.submit(prompt="Hi", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(InvalidRequestError, match=r"request\.input_ids\[1\] = 18446744073709551616"):
        core.submit(input_ids=[1, 2**64])
    assert core.requests == {}


def test_an_id_in_flight_on_this_client_is_refused_before_sending_and_the_request_holding_it_is_kept():
    """The server could only refuse the second request on the id itself, which would end the first in
    this client's eyes (an error in its queue, its outputs after that dropped)."""
    core = ClientCore()
    core.submit(prompt="Hi", req_id=42, sampling={"n": 3}, now_s=1.0)  # 42 .. 44
    core.receive(output(43, "a", [5]))
    for req_id, n in ((42, 1), (44, 1), (40, 3)):  # the id, the last choice's, a range reaching the first
        with pytest.raises(InvalidRequestError, match=r"req_id (42|44) is already in flight on this client"):
            core.submit(prompt="Hi", req_id=req_id, sampling={"n": n})
    assert set(core.requests) == {42, 43, 44} and core.sent_s(43) == 1.0 and len(core.requests[43].outputs) == 1
    core.receive(output(42, "", [], FinishReason.LENGTH))
    core.next_output(42)  # read to its end: the id is free again
    assert core.submit(prompt="Hi", req_id=42)[0] == 42


def test_outputs_are_read_in_order_and_the_last_one_ends_the_request():
    core = ClientCore()
    req_id, _ = core.submit(prompt="Hi", now_s=10.0)
    assert core.next_output(req_id) is None  # nothing came yet
    assert core.receive(output(req_id, "Hel", [5]), 10.25) == req_id
    assert core.receive(output(req_id, "lo", [6], FinishReason.LENGTH, prompt_tokens=2, completion_tokens=2), 10.5) == req_id
    assert core.finished([req_id, 99]) == [req_id]
    builder = ResultBuilder(req_id, core.sent_s(req_id))
    while not builder.done:
        item = core.next_output(req_id)
        assert item is not None
        builder.add(item[1], item[0])
    result = builder.result
    assert (result.text, result.output_ids, result.finish_reason) == ("Hello", [5, 6], "length")
    assert (result.ttft_s, result.latency_s) == (0.25, 0.5)  # from submit to each output's arrival
    assert req_id not in core.requests and core.finished([req_id]) == []
    with pytest.raises(ValueError, match="not in flight"):
        core.check_in_flight(req_id)


def test_outputs_for_requests_not_in_flight_are_dropped():
    core = ClientCore()
    req_id, _ = core.submit(prompt="Hi")
    assert core.receive(output(req_id + 7, "x", [1])) is None
    assert core.forget(req_id) is True and core.forget(req_id) is False
    assert core.receive(output(req_id, "late", [1], FinishReason.ABORT)) is None
    assert core.requests == {}


def test_an_error_output_is_filed_and_raised_by_the_result_with_its_code():
    core = ClientCore()
    req_id, _ = core.submit(prompt="Hi")
    core.receive(output(req_id, "", [], FinishReason.ERROR, code=ErrorCode.BUSY, error="queue full"))
    _, out = core.next_output(req_id)
    with pytest.raises(ServerBusyError, match="queue full"):
        ResultBuilder(req_id).add(out)


def test_fail_all_lets_the_outputs_that_came_be_read_first_and_spares_later_requests():
    core = ClientCore()
    req_id, _ = core.submit(prompt="Hi")
    core.receive(output(req_id, "a", [1]))
    core.fail_all(ServerGoneError("gone"))
    later_id, _ = core.submit(prompt="Hi again")
    assert core.next_output(req_id)[1].text == "a"
    with pytest.raises(ServerGoneError, match="gone"):
        core.next_output(req_id)
    assert core.next_output(later_id) is None  # sent after: waits for its own outputs


def test_stats_answers_are_filed_by_req_id_and_a_refusal_raises():
    core = ClientCore(api_key="k")
    req_id, frame = core.stats_request()
    assert CLIENT_TO_FRONTEND.decode(frame) == StatsReq(req_id, api_key="k")
    assert core.take_stats(req_id) is None
    assert core.receive(FRONTEND_TO_CLIENT.encode(StatsOut(req_id=req_id + 1, scheduler=SchedulerStats(num_running=9)))) is None  # not asked
    answer = StatsOut(req_id=req_id, scheduler=SchedulerStats(num_running=2))
    assert core.receive(FRONTEND_TO_CLIENT.encode(answer)) == req_id
    assert core.take_stats(req_id) == answer
    assert core.stats_answers == {}
    refused_id, _ = core.stats_request()
    core.receive(FRONTEND_TO_CLIENT.encode(StatsOut(req_id=refused_id, code=ErrorCode.UNAUTHORIZED, error="bad key")))
    with pytest.raises(UnauthorizedError, match="bad key"):
        core.take_stats(refused_id)
    gone_id, _ = core.stats_request()
    core.fail_all(ServerGoneError("gone"))
    with pytest.raises(ServerGoneError):
        core.take_stats(gone_id)


def test_tokenize_answers_are_filed_by_req_id_and_a_refusal_raises():
    core = ClientCore(api_key="k")
    req_id, frame = core.tokenize_request({"prompt": "hi"}, add_special_tokens=False)
    assert CLIENT_TO_FRONTEND.decode(frame) == TokenizeReq(req_id, {"prompt": "hi"}, False, api_key="k")
    assert core.take_tokenize(req_id) is None
    assert core.receive(FRONTEND_TO_CLIENT.encode(TokenizeOut(req_id + 1, input_ids=[1]))) is None  # not asked
    assert core.receive(FRONTEND_TO_CLIENT.encode(TokenizeOut(req_id, input_ids=[5, 6]))) == req_id
    assert core.receive(FRONTEND_TO_CLIENT.encode(TokenizeOut(req_id, input_ids=[7]))) is None  # answered already
    assert core.take_tokenize(req_id) == TokenizeOut(req_id, input_ids=[5, 6]) and core.tokenize_answers == {}
    refused_id, _ = core.tokenize_request({"input_ids": [10**9]})
    core.receive(FRONTEND_TO_CLIENT.encode(TokenizeOut(refused_id, code=ErrorCode.INVALID, error="not a token id")))
    with pytest.raises(InvalidRequestError, match="not a token id"):
        core.take_tokenize(refused_id)
    gone_id, _ = core.tokenize_request({"prompt": "x"})
    core.fail_all(ServerGoneError("gone"))
    with pytest.raises(ServerGoneError):
        core.take_tokenize(gone_id)


def test_heartbeats_and_their_acks():
    core = ClientCore("c", api_key="k")
    assert CLIENT_TO_FRONTEND.decode(core.heartbeat()) == Heartbeat("c", "k")
    core.last_ack_s -= 100.0
    assert core.silent_for_s() >= 100.0
    assert core.receive(FRONTEND_TO_CLIENT.encode(HeartbeatAck(client_id="c"))) is None
    assert core.silent_for_s() < 1.0


def test_close_aborts_everything_in_flight_and_forgets_it():
    core = ClientCore()
    req_id, _ = core.submit(prompt="Hi", sampling={"n": 2})
    frames = core.close()
    assert sorted(CLIENT_TO_FRONTEND.decode(f).req_id for f in frames) == [req_id, req_id + 1]
    assert all(isinstance(CLIENT_TO_FRONTEND.decode(f), AbortReq) for f in frames)
    assert core.requests == {} and core.finished([req_id]) == []
