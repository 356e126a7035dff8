from __future__ import annotations

import re
from enum import IntEnum
from typing import Any

import msgpack
import numpy as np
import pytest

from zserve.client.types import (
    InvalidRequestError,
    ServerBusyError,
    ServerError,
    ServerGoneError,
    ServerShuttingDownError,
    UnauthorizedError,
    raise_for_error,
)
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import ForwardBatch, SamplingArrays, StepResult
from zserve.common.messages import (
    DETOK_INBOX,
    FRONTEND_INBOX,
    NO_TOKEN_IDS,
    SCHEDULER_INBOX,
    FailAll,
    GenerateReq,
    ReqOutput,
    TokenizedReq,
    TokenOut,
    TokenOutBatch,
)
from zserve.common.sampling_params import SamplingParams
from zserve.common.wire import BoolArray, Codec, Float32Array, Int32Array, Int64Array, WireError, message
from zserve.http_proc.api_error import ApiError, error_code_of


def _batch() -> ForwardBatch:
    return ForwardBatch(
        step_id=7,
        input_ids=np.array([5, 6, 7, 9], np.int32),
        cached_lens=np.array([0, 10], np.int32),
        extend_lens=np.array([3, 1], np.int32),
        page_ids=np.array([4, 0, 1, 2], np.int32),
        num_pages=np.array([1, 3], np.int32),
        is_sampled=np.array([False, True]),
        return_logprob=np.array([False, True]),
        sampling=SamplingArrays(
            temperature=np.array([0.0, 0.7], np.float32),
            top_k=np.array([0, 5], np.int32),
            top_p=np.array([1.0, 0.9], np.float32),
            min_p=np.array([0.0, 0.1], np.float32),
            seed=np.array([1, 2**40], np.int64),
        ),
    )


def test_forward_batch_round_trip_is_exact():
    codec = Codec(ForwardBatch, StepResult)
    batch = _batch()
    got = codec.decode(codec.encode(batch))
    for name in ("input_ids", "cached_lens", "extend_lens", "page_ids", "num_pages", "is_sampled", "return_logprob"):
        np.testing.assert_array_equal(getattr(got, name), getattr(batch, name))
        assert getattr(got, name).dtype == getattr(batch, name).dtype
    np.testing.assert_array_equal(got.sampling.seed, batch.sampling.seed)
    np.testing.assert_array_equal(got.sampling.top_p, batch.sampling.top_p)
    assert got.step_id == 7
    got.validate(page_size=4, num_pages_total=5)


def test_ids_travel_as_raw_bytes_not_lists():
    codec = Codec(ForwardBatch)
    batch = _batch()
    batch.input_ids = np.arange(4096, dtype=np.int32)
    batch.extend_lens = np.array([4095, 1], np.int32)
    frame = codec.encode(batch)
    fields = msgpack.unpackb(frame)
    assert isinstance(fields[2], bytes) and len(fields[2]) == 4096 * 4


def test_step_result_round_trip():
    codec = Codec(ForwardBatch, StepResult)
    res = StepResult(3, np.array([42], np.int32), np.array([-0.5], np.float32), forward_ms=1.5)
    got = codec.decode(codec.encode(res))
    assert got.step_id == 3 and got.next_token_ids.tolist() == [42] and got.logprobs.tolist() == [-0.5]


@pytest.mark.parametrize("frame", [b"", b"\xc1garbage", msgpack.packb({"a": 1}), msgpack.packb([99, 1]), msgpack.packb([1, 2])])
def test_garbage_frames_raise_wire_error(frame):
    with pytest.raises(WireError):
        Codec(ForwardBatch, StepResult).decode(frame)


def test_codec_refuses_messages_the_socket_does_not_carry():
    with pytest.raises(TypeError):
        Codec(StepResult).encode(_batch())


def test_validate_names_the_slot_outside_the_pool():
    batch = _batch()
    batch.page_ids = np.array([4, 0, 1, 9], np.int32)
    with pytest.raises(ValueError, match=r"page id 9 \(slots 36\.\.39\)"):
        batch.validate(page_size=4, num_pages_total=5)


def test_validate_rejects_wrong_page_count():
    batch = _batch()
    with pytest.raises(ValueError, match="request 0 has 1 pages for 3 tokens"):
        batch.validate(page_size=2, num_pages_total=50)


def _batch_with_copies() -> ForwardBatch:
    """A decode row, then a source (cached 4, extend 6) and two copies of it; page_size 4."""
    return ForwardBatch(
        step_id=8,
        input_ids=np.array([9, 1, 2, 3, 4, 5, 6], np.int32),  # the decode token, then the source's 6 only
        cached_lens=np.array([10, 4, 4, 4], np.int32),
        extend_lens=np.array([1, 6, 6, 6], np.int32),
        page_ids=np.array([0, 1, 2, 3, 4, 5, 3, 6, 7, 3, 8, 9], np.int32),
        num_pages=np.array([3, 3, 3, 3], np.int32),
        is_sampled=np.ones(4, bool),
        return_logprob=np.array([False, False, True, False]),
        sampling=SamplingArrays.greedy(4),
        copy_of=np.array([0, 1, 1, 1], np.int32),
    )


def test_copies_round_trip_and_no_copies_travel_as_nil():
    codec = Codec(ForwardBatch)
    got = codec.decode(codec.encode(_batch_with_copies()))
    assert got.copy_of.tolist() == [0, 1, 1, 1] and got.num_tokens == 7
    got.validate(page_size=4, num_pages_total=10)
    plain = codec.decode(codec.encode(_batch()))
    assert plain.copy_of is None and plain.is_computed.tolist() == [True, True] and plain.computed_part() is plain


def test_computed_part_drops_the_copies_and_copied_slots_cover_their_positions():
    batch = _batch_with_copies()
    assert batch.is_computed.tolist() == [True, True, False, False]
    part = batch.computed_part()
    assert part.copy_of is None and part.extend_lens.tolist() == [1, 6] and part.cached_lens.tolist() == [10, 4]
    assert part.page_ids.tolist() == [0, 1, 2, 3, 4, 5] and part.return_logprob.tolist() == [False, False]
    part.validate(page_size=4, num_pages_total=10)
    src, dst = batch.copied_slots(page_size=4)
    # positions 4..9: source pages 4, 5 (slots 16..23); copy 1 pages 6, 7; copy 2 pages 8, 9
    assert src.tolist() == [16, 17, 18, 19, 20, 21] * 2
    assert dst.tolist() == [24, 25, 26, 27, 28, 29, 32, 33, 34, 35, 36, 37]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: setattr(b, "copy_of", np.array([0, 1, 1], np.int32)), "copy_of has 3 entries, expected 4"),
        (lambda b: setattr(b, "copy_of", np.array([0, 1, 3, 1], np.int32)), "request 2 is a copy of 3, not an earlier request"),
        (lambda b: setattr(b, "copy_of", np.array([0, 1, 1, 2], np.int32)), "request 3 is a copy of 2, itself a copy"),
        (lambda b: setattr(b, "copy_of", np.array([0, 0, 1, 1], np.int32)), "request 1 is a copy of 0 with other cached_len"),
        (lambda b: b.is_sampled.__setitem__(1, False), "request 2 is a copy of 1, but both must be sampled"),
        (lambda b: setattr(b, "input_ids", np.arange(13, dtype=np.int32)), "the computed requests=7 != len(input_ids)=13"),
    ],
)
def test_validate_refuses_bad_copies(edit, message):
    batch = _batch_with_copies()
    edit(batch)
    with pytest.raises(ValueError, match=re.escape(message)):
        batch.validate(page_size=4, num_pages_total=10)


# ---- the @message decorator ---------------------------------------------------------------------


class Color(IntEnum):
    RED = 1
    BLUE = 2


@message()
class Point:
    x: int
    y: float


@message(90)
class Shape:
    name: str
    corners: list[Point]
    center: Point | None
    ids: list[int]
    tags: list[str]
    weights: list[float]
    attrs: dict[str, int]
    color: Color | None = None


@message(91)
class Arrays:
    i32: Int32Array
    i64: Int64Array
    f32: Float32Array
    flags: BoolArray
    maybe: Int32Array | None = None


@message(92)
class Loose:
    body: dict[str, Any]
    info: dict[str, int | str | list[int]]


SHAPES = Codec(Shape, Arrays, Loose)


def _shape() -> Shape:
    return Shape(
        name="tri", corners=[Point(0, 0.0), Point(3, 0.5)], center=Point(1, 2.0), ids=[1, 2], tags=["a"], weights=[0.5],
        attrs={"n": 3}, color=Color.BLUE,
    )


def test_nested_messages_round_trip():
    got = SHAPES.decode(SHAPES.encode(_shape()))
    assert got == _shape()
    assert type(got.corners[0]) is Point and got.color is Color.BLUE
    assert SHAPES.decode(SHAPES.encode(Shape("none", [], None, [], [], [], {}))).center is None


def test_an_int_travels_into_a_float_field_as_a_float():
    got = SHAPES.decode(SHAPES.encode(Shape("p", [Point(1, 2)], None, [], [], [3], {})))  # type: ignore[arg-type]
    assert type(got.corners[0].y) is float and type(got.weights[0]) is float


def _forged(values_by_field: dict[str, Any]) -> bytes:
    """A frame of `_shape()` with some fields' wire values replaced."""
    names = list(Shape.__dataclass_fields__)
    values = _shape().to_wire()
    for name, value in values_by_field.items():
        values[names.index(name)] = value
    return msgpack.packb([Shape.TAG, *values], use_bin_type=True)


@pytest.mark.parametrize(
    ("forged", "where"),
    [
        ({"ids": [1, "2"]}, "Shape.ids: expected int, got str"),
        ({"ids": [1, True]}, "Shape.ids: expected int, got bool"),
        ({"ids": "12"}, "Shape.ids: expected a list"),
        ({"tags": [b"a"]}, "Shape.tags"),
        ({"weights": ["0.5"]}, "Shape.weights"),
        ({"attrs": {1: 3}}, "Shape.attrs: map keys must be strings"),
        ({"attrs": {"n": "3"}}, "Shape.attrs"),
        ({"corners": [[0, 0.0, 9]]}, "Shape.corners: Point takes 2 fields, got 3"),
        ({"corners": [[0, "y"]]}, "Shape.corners: Point.y: expected float, got str"),
        ({"center": 5}, "Shape.center"),
        ({"color": 3}, "Shape.color: 3 is not a Color"),
        ({"color": True}, "Shape.color: expected Color, got bool"),
        ({"name": None}, "Shape.name: expected str, got NoneType"),
    ],
)
def test_forged_fields_raise_wire_error_naming_the_field(forged, where):
    with pytest.raises(WireError, match=where):
        SHAPES.decode(_forged(forged))


def test_array_fields_round_trip_with_their_dtype_as_read_only_views():
    msg = Arrays(
        i32=np.array([1, -2], np.int32), i64=np.array([2**40], np.int64), f32=np.array([0.5, 1.5], np.float32),
        flags=np.array([True, False]),
    )
    got = SHAPES.decode(SHAPES.encode(msg))
    for name, dtype in (("i32", np.int32), ("i64", np.int64), ("f32", np.float32), ("flags", np.bool_)):
        arr = getattr(got, name)
        assert arr.dtype == dtype and arr.tolist() == getattr(msg, name).tolist() and not arr.flags.writeable
    assert got.maybe is None
    with_ids = SHAPES.decode(SHAPES.encode(Arrays(msg.i32, msg.i64, msg.f32, msg.flags, maybe=np.arange(3, dtype=np.int32))))
    assert with_ids.maybe.tolist() == [0, 1, 2]


def test_an_array_is_converted_to_its_declared_dtype_when_sent():
    got = SHAPES.decode(SHAPES.encode(Arrays(np.array([1, 2], np.int64), [5], np.array([1.0]), [1, 0])))  # type: ignore[arg-type]
    assert got.i32.dtype == np.int32 and got.i32.tolist() == [1, 2] and got.i64.tolist() == [5] and got.flags.tolist() == [True, False]


@pytest.mark.parametrize("raw", [b"\x00\x01\x02", "text", [1, 2]])
def test_forged_array_bytes_raise_wire_error(raw):
    frame = msgpack.packb([Arrays.TAG, raw, b"", b"", b"", None], use_bin_type=True)
    with pytest.raises(WireError, match="Arrays.i32"):
        SHAPES.decode(frame)


def test_any_and_union_fields_take_json_like_values():
    msg = Loose(body={"prompt": "hi", "sampling": {"stop": ["x"], "seed": None}}, info={"port": 1, "url": "u", "ids": [1]})
    assert SHAPES.decode(SHAPES.encode(msg)) == msg
    with pytest.raises(WireError, match=re.escape("Loose.info: expected int | str | list, got float")):
        SHAPES.decode(msgpack.packb([Loose.TAG, {}, {"port": 1.5}]))


def test_a_field_without_an_element_type_is_refused_at_declaration():
    with pytest.raises(TypeError, match="Bad.items"):

        @message(93)
        class Bad:
            items: list


def test_a_nested_only_message_cannot_be_carried_by_itself():
    with pytest.raises(ValueError, match="no tag"):
        Codec(Point)


def test_sampling_params_travel_typed_inside_a_tokenized_request():
    params = SamplingParams(max_tokens=9, temperature=0.5, seed=3, stop=("###",), stop_token_ids=(7,), return_logprob=True)
    req = TokenizedReq(req_id=1, input_ids=np.array([5, 6], np.int32), params=params)
    got = SCHEDULER_INBOX.decode(SCHEDULER_INBOX.encode(req))
    assert got.params == params and got.input_ids.tolist() == [5, 6]
    values = req.to_wire()
    values[2][1] = "hot"  # temperature
    with pytest.raises(WireError, match="TokenizedReq.params: SamplingParams.temperature"):
        SCHEDULER_INBOX.decode(msgpack.packb([TokenizedReq.TAG, *values], use_bin_type=True))


def test_token_outs_travel_as_records():
    outs = [
        TokenOut(req_id=1, token_ids=np.array([42], np.int32), num_cached_tokens=4, logprobs=[-0.5]),
        TokenOut(req_id=2, token_ids=NO_TOKEN_IDS, finish_reason=FinishReason.ERROR, code=ErrorCode.BUSY, error="server busy"),
    ]
    got = DETOK_INBOX.decode(DETOK_INBOX.encode(TokenOutBatch(outs=outs))).outs
    assert [o.token_ids.tolist() for o in got] == [[42], []]
    assert (got[0].finish_reason, got[0].num_cached_tokens, got[0].logprobs) == (None, 4, [-0.5])
    assert (got[1].finish_reason, got[1].code, got[1].error) == (FinishReason.ERROR, ErrorCode.BUSY, "server busy")


def test_generate_req_body_is_carried_as_sent_and_fail_all_is_typed():
    req = GenerateReq(req_id=1, client_id="c", body={"prompt": "x", "sampling": {"max_tokens": "many"}})
    from zserve.common.messages import CLIENT_TO_FRONTEND

    assert CLIENT_TO_FRONTEND.decode(CLIENT_TO_FRONTEND.encode(req)) == req  # validated by the frontend, not here
    fail = FailAll(finish_reason=FinishReason.ERROR, code=ErrorCode.GONE, error="server failure: x")
    got = FRONTEND_INBOX.decode(FRONTEND_INBOX.encode(fail))
    assert (got.finish_reason, got.code) == (FinishReason.ERROR, ErrorCode.GONE)


def test_finish_reason_is_an_int_on_the_wire_and_a_word_for_clients():
    assert [r.text for r in FinishReason] == ["stop", "length", "abort", "error"]
    assert msgpack.packb(FinishReason.STOP) == msgpack.packb(1) and str(FinishReason.ABORT) == "abort"


# ---- error codes -> client exceptions -> HTTP statuses ----------------------------------------

CODE_MAPPING = [
    (ErrorCode.BUSY, ServerBusyError, 503, "server_busy"),
    (ErrorCode.INVALID, InvalidRequestError, 400, None),
    (ErrorCode.INTERNAL, ServerError, 500, "internal_error"),
    (ErrorCode.GONE, ServerGoneError, 500, "server_failure"),
    (ErrorCode.UNAVAILABLE, ServerGoneError, 503, "server_unavailable"),
    (ErrorCode.UNAUTHORIZED, UnauthorizedError, 500, "frontend_unauthorized"),  # HTTP's own key check answers 401 first
    (ErrorCode.SHUTTING_DOWN, ServerShuttingDownError, 503, "server_draining"),
]


def test_every_error_code_is_mapped():
    assert {c for c, *_ in CODE_MAPPING} == set(ErrorCode)


@pytest.mark.parametrize(("code", "exc_type", "status", "api_code"), CODE_MAPPING)
def test_each_error_code_maps_to_its_client_exception_and_http_status(code, exc_type, status, api_code):
    out = ReqOutput.final(5, FinishReason.ERROR, code=code, error="some text that says nothing")
    out = FRONTEND_INBOX.decode(FRONTEND_INBOX.encode(out))
    with pytest.raises(ServerError) as info:
        raise_for_error(out)
    exc = info.value
    assert type(exc) is exc_type and exc.code is code and exc.req_id == 5
    assert exc.message == "some text that says nothing" and str(exc) == "request 5: some text that says nothing"
    error = ApiError.from_client_error(exc)
    assert (error.status, error.code) == (status, api_code)
    assert error.message.endswith("some text that says nothing")
    assert error_code_of(status, api_code) is code  # the HTTP client gets the same code back


def test_a_finish_other_than_error_raises_nothing():
    for reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT, None):
        raise_for_error(ReqOutput(req_id=1, text="", token_ids=NO_TOKEN_IDS, finish_reason=reason))


def test_an_error_without_a_code_is_internal():
    with pytest.raises(ServerError) as info:
        raise_for_error(ReqOutput(req_id=1, text="", token_ids=NO_TOKEN_IDS, finish_reason=FinishReason.ERROR))
    assert type(info.value) is ServerError and info.value.code is ErrorCode.INTERNAL


def test_http_error_responses_map_back_by_status_when_the_code_is_not_ours():
    assert error_code_of(404, None) is ErrorCode.INVALID
    assert error_code_of(503, "server_draining") is ErrorCode.SHUTTING_DOWN  # ours: by its code
    assert error_code_of(503, "overloaded") is ErrorCode.UNAVAILABLE
    assert error_code_of(500, None) is ErrorCode.INTERNAL


def test_stats_out_carries_every_scheduler_stats_field():
    """The scheduler sends asdict(SchedulerStats()) as StatsOut: every field's type must pass the
    socket's decoder, or the stats frame is dropped and clients time out waiting for it."""
    from dataclasses import asdict, replace

    from zserve.common.messages import DETOK_INBOX, StatsOut
    from zserve.scheduler_proc.scheduler_stats import SchedulerStats

    stats = asdict(replace(SchedulerStats(), num_running=3, new_token_ratio=0.55))
    got = DETOK_INBOX.decode(DETOK_INBOX.encode(StatsOut(req_id=7, stats=stats)))
    assert got.stats == stats
