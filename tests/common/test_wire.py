from __future__ import annotations

import re
from enum import IntEnum
from typing import Any

import msgpack
import msgspec
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
from zserve.common.forward_batch import (
    ForwardBatch,
    GrammarMasks,
    PromptLogprobRows,
    SamplingArrays,
    StepResult,
)
from zserve.common.histogram import Histogram
from zserve.common.messages import (
    CLIENT_TO_FRONTEND,
    DETOK_INBOX,
    FRONTEND_INBOX,
    FRONTEND_TO_CLIENT,
    NO_TOKEN_IDS,
    SCHEDULER_INBOX,
    FailAll,
    FrontendStats,
    GenerateReq,
    ReqOutput,
    StatsOut,
    TokenizedReq,
    TokenOut,
    TokenOutBatch,
)
from zserve.common.sampling_params import SamplingParams
from zserve.common.scheduler_stats import SchedulerStats
from zserve.common.wire import (
    BoolArray,
    Codec,
    Float32Array,
    Int32Array,
    Int64Array,
    Message,
    WireError,
    tag_of,
)
from zserve.http_proc.shared.api_error import ApiError, error_code_of


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
    assert fields[2] == msgpack.ExtType(Int32Array.ext_code, batch.input_ids.tobytes()) and len(fields[2].data) == 4096 * 4


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


def _batch_with_kv_sharing() -> ForwardBatch:
    """A decode row, then a KV source (cached 4, extend 6) and two rows taking its K/V; page_size 4."""
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
        kv_source=np.array([0, 1, 1, 1], np.int32),
    )


def test_kv_sources_round_trip_and_none_travel_as_nil():
    codec = Codec(ForwardBatch)
    got = codec.decode(codec.encode(_batch_with_kv_sharing()))
    assert got.kv_source.tolist() == [0, 1, 1, 1] and got.num_tokens == 7
    got.validate(page_size=4, num_pages_total=10)
    plain = codec.decode(codec.encode(_batch()))
    assert plain.kv_source is None and plain.is_computed.tolist() == [True, True] and plain.computed_part() is plain


def test_computed_part_drops_the_kv_sharing_rows_and_shared_slots_cover_their_positions():
    batch = _batch_with_kv_sharing()
    assert batch.is_computed.tolist() == [True, True, False, False]
    part = batch.computed_part()
    assert part.kv_source is None and part.extend_lens.tolist() == [1, 6] and part.cached_lens.tolist() == [10, 4]
    assert part.page_ids.tolist() == [0, 1, 2, 3, 4, 5] and part.return_logprob.tolist() == [False, False]
    part.validate(page_size=4, num_pages_total=10)
    src, dst = batch.shared_kv_slots(page_size=4)
    # positions 4..9: source pages 4, 5 (slots 16..23); row 2 pages 6, 7; row 3 pages 8, 9
    assert src.tolist() == [16, 17, 18, 19, 20, 21] * 2
    assert dst.tolist() == [24, 25, 26, 27, 28, 29, 32, 33, 34, 35, 36, 37]


def test_token_starts_are_by_row_and_a_sharing_row_points_at_its_source():
    assert _batch_with_kv_sharing().token_starts().tolist() == [0, 1, 1, 1]
    batch = _batch_with_kv_sharing()
    batch.kv_source = None
    batch.input_ids = np.arange(19, dtype=np.int32)
    assert batch.token_starts().tolist() == [0, 1, 7, 13]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: setattr(b, "kv_source", np.array([0, 1, 1], np.int32)), "kv_source has 3 entries, expected 4"),
        (lambda b: setattr(b, "kv_source", np.array([0, 1, 3, 1], np.int32)), "request 2 takes its K/V from 3, not an earlier request"),
        (lambda b: setattr(b, "kv_source", np.array([0, 1, 1, 2], np.int32)), "request 3 takes its K/V from 2, which is not computed"),
        (lambda b: setattr(b, "kv_source", np.array([0, 0, 1, 1], np.int32)), "request 1 takes its K/V from 0, with other cached_len"),
        (lambda b: b.is_sampled.__setitem__(1, False), "request 2 takes its K/V from 1, but both must be sampled"),
        (lambda b: setattr(b, "input_ids", np.arange(13, dtype=np.int32)), "the computed requests=7 != len(input_ids)=13"),
        (
            lambda b: setattr(b, "prompt_logprobs", PromptLogprobRows(np.array([1, 4], np.int32), np.array([-1, -1], np.int32), 0)),
            "prompt_logprobs.rows must be ascending rows of the batch's 4",
        ),
        (
            lambda b: setattr(b, "grammar", GrammarMasks(np.array([2, 1], np.int32), 1, np.zeros(2, np.int32))),
            "grammar.rows must be ascending rows of the batch's 4",
        ),
    ],
)
def test_validate_refuses_bad_kv_sources_and_rows(edit, message):
    batch = _batch_with_kv_sharing()
    edit(batch)
    with pytest.raises(ValueError, match=re.escape(message)):
        batch.validate(page_size=4, num_pages_total=10)


# ---- declaring messages ---------------------------------------------------------------------------


class Color(IntEnum):
    RED = 1
    BLUE = 2


class Point(Message):
    x: int
    y: float


class Shape(Message, tag=90):
    name: str
    corners: list[Point]
    center: Point | None
    ids: list[int]
    tags: list[str]
    weights: list[float]
    attrs: dict[str, int]
    color: Color | None = None


class Arrays(Message, tag=91):
    i32: Int32Array
    i64: Int64Array
    f32: Float32Array
    flags: BoolArray
    maybe: Int32Array | None = None


class Loose(Message, tag=92):
    body: dict[str, Any]
    info: dict[str, int | str | list[int]]


SHAPES = Codec(Shape, Arrays)
LOOSE = Codec(Loose)  # Any fields travel on a socket without arrays


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
    names = list(Shape.__struct_fields__)
    tag, *values = msgpack.unpackb(SHAPES.encode(_shape()))
    for name, value in values_by_field.items():
        values[names.index(name)] = value
    return msgpack.packb([tag, *values], use_bin_type=True)


@pytest.mark.parametrize(
    ("forged", "where"),
    [
        ({"ids": [1, "2"]}, "Shape.ids[1]: Expected `int`, got `str`"),
        ({"ids": [1, True]}, "Shape.ids[1]: Expected `int`, got `bool`"),
        ({"ids": "12"}, "Shape.ids: Expected `list`, got `str`"),
        ({"tags": [b"a"]}, "Shape.tags[0]: Expected `str`, got `bytes`"),
        ({"weights": ["0.5"]}, "Shape.weights[0]: Expected `float`, got `str`"),
        ({"attrs": {1: 3}}, "Shape.attrs (a key): Expected `str`, got `int`"),
        ({"attrs": {"n": "3"}}, "Shape.attrs[...]: Expected `int`, got `str`"),
        ({"corners": [[0, 0.0, 9]]}, "Shape.corners[0]: Expected `list` of at most length 2, got 3"),
        ({"corners": [[0, "y"]]}, "Shape.corners[0].y: Expected `float`, got `str`"),
        ({"center": 5}, "Shape.center: Expected `list | None`, got `int`"),
        ({"color": 3}, "Shape.color: Invalid enum value 3"),
        ({"color": True}, "Shape.color: Expected `int | None`, got `bool`"),
        ({"name": None}, "Shape.name: Expected `str`, got `None`"),
    ],
)
def test_forged_fields_raise_wire_error_naming_the_field(forged, where):
    with pytest.raises(WireError, match=re.escape(where)):
        SHAPES.decode(_forged(forged))


@pytest.mark.parametrize(
    ("num_fields", "error"),
    [
        (6, "malformed Shape: Expected `list` of at least length 8, got 7"),  # the tag and 7 fields without a default
        (9, "malformed Shape: Expected `list` of at most length"),  # 8 fields, 9 sent
    ],
)
def test_a_frame_with_missing_or_extra_fields_raises_wire_error(num_fields, error):
    tag, *values = msgpack.unpackb(SHAPES.encode(_shape()))
    frame = msgpack.packb([tag, *values, None][: num_fields + 1])
    with pytest.raises(WireError, match=re.escape(error)):
        SHAPES.decode(frame)


def test_array_fields_round_trip_with_their_dtype_as_read_only_views():
    msg = Arrays(
        i32=np.array([1, -2], np.int32), i64=np.array([2**40], np.int64), f32=np.array([0.5, 1.5], np.float32),
        flags=np.array([True, False]),
    )
    frame = SHAPES.encode(msg)
    got = SHAPES.decode(frame)
    for name, dtype in (("i32", np.int32), ("i64", np.int64), ("f32", np.float32), ("flags", np.bool_)):
        arr = getattr(got, name)
        assert arr.dtype == dtype and arr.tolist() == getattr(msg, name).tolist() and not arr.flags.writeable
        assert arr.base.obj is frame  # a view of the frame itself: no copy
    assert got.maybe is None
    with_ids = SHAPES.decode(SHAPES.encode(Arrays(msg.i32, msg.i64, msg.f32, msg.flags, maybe=np.arange(3, dtype=np.int32))))
    assert with_ids.maybe.tolist() == [0, 1, 2]


def _arrays(**changes: Any) -> Arrays:
    fields = {
        "i32": np.array([1, 2], np.int32), "i64": np.array([5], np.int64), "f32": np.array([1.0], np.float32),
        "flags": np.array([True, False]),
    }
    return Arrays(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"i32": np.array([1, 2], np.int64)}, "Arrays.i32: Expected `Int32Array`, got `numpy.ndarray`"),
        ({"i64": [5]}, "Arrays.i64: Expected `Int64Array`, got `list`"),
        ({"flags": np.array([1, 0], np.int32)}, "Arrays.flags: Expected `BoolArray`, got `numpy.ndarray`"),
    ],
)
def test_an_array_of_another_dtype_than_declared_is_refused_by_the_receiver(changes, error):
    frame = SHAPES.encode(_arrays(**changes))  # the sender does not convert: it sends what it has
    with pytest.raises(WireError, match=re.escape(error)):
        SHAPES.decode(frame)


@pytest.mark.parametrize("array", [np.array([1.0]), np.array([1], ">i4")])
def test_an_array_of_no_wire_dtype_cannot_be_sent(array):
    with pytest.raises(TypeError, match="a wire array is int32, int64, float32 or bool"):
        SHAPES.encode(_arrays(f32=array))


def test_a_2d_array_travels_flattened():
    assert SHAPES.decode(SHAPES.encode(_arrays(i32=np.arange(4, dtype=np.int32).reshape(2, 2)))).i32.tolist() == [0, 1, 2, 3]


def test_a_strided_array_travels_as_its_elements():
    got = SHAPES.decode(SHAPES.encode(_arrays(i32=np.arange(6, dtype=np.int32)[::2])))
    assert got.i32.tolist() == [0, 2, 4]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\x00\x01\x02", "Arrays.i32: Expected `Int32Array`, got `bytes`"),
        ("text", "Arrays.i32: Expected `Int32Array`, got `str`"),
        ([1, 2], "Arrays.i32: Expected `Int32Array`, got `list`"),
        (msgpack.ExtType(2, b"\x00" * 8), "Arrays.i32: Expected `Int32Array`, got `numpy.ndarray`"),  # an int64 array
        (msgpack.ExtType(1, b"\x00\x01\x02"), "malformed Arrays: an array's buffer size must be a multiple of element size"),
        (msgpack.ExtType(9, b"\x00\x01\x02\x03"), "malformed Arrays: unknown ext type 9"),
    ],
)
def test_forged_array_bytes_raise_wire_error(raw, error):
    empty = [msgpack.ExtType(code, b"") for code in (2, 3, 4)]
    frame = msgpack.packb([tag_of(Arrays), raw, *empty, None], use_bin_type=True)
    with pytest.raises(WireError, match=re.escape(error)):
        SHAPES.decode(frame)


def test_any_and_union_fields_take_json_like_values():
    msg = Loose(body={"prompt": "hi", "sampling": {"stop": ["x"], "seed": None}}, info={"port": 1, "url": "u", "ids": [1]})
    assert LOOSE.decode(LOOSE.encode(msg)) == msg
    with pytest.raises(WireError, match=re.escape("Loose.info[...]: Expected `int | str | list`, got `float`")):
        LOOSE.decode(msgpack.packb([tag_of(Loose), {}, {"port": 1.5}]))


class BareInner(Message):
    stuff: list


class Bare(Message, tag=93):
    inner: list[BareInner] | None


class BareMap(Message, tag=94):
    attrs: dict


@pytest.mark.parametrize(("cls", "where"), [(Bare, "BareInner.stuff: list"), (BareMap, "BareMap.attrs: dict")])
def test_a_field_without_an_element_type_is_refused_by_the_codec(cls, where):
    with pytest.raises(TypeError, match=f"{where} has no element type"):
        Codec(cls)


def test_a_nested_only_message_cannot_be_carried_by_itself():
    with pytest.raises(ValueError, match="no int tag"):
        Codec(Point)


def test_an_ext_value_inside_an_any_field_stays_an_ext_not_an_array():
    frame = msgpack.packb([tag_of(GenerateReq), 1, "c", {"input_ids": msgpack.ExtType(1, b"\x01\x00\x00\x00")}, ""])
    got = CLIENT_TO_FRONTEND.decode(frame)
    assert type(got.body["input_ids"]) is msgspec.msgpack.Ext  # the frontend's validator refuses it


def test_any_fields_and_array_fields_cannot_share_a_socket():
    with pytest.raises(ValueError, match="Any fields or array fields, not both"):
        Codec(Loose, Arrays)


def test_two_messages_with_one_tag_cannot_share_a_socket():
    class Other(Message, tag=90):
        x: int

    with pytest.raises(ValueError, match="tag 90 used by both Shape and Other"):
        Codec(Shape, Other)


def test_sampling_params_travel_typed_inside_a_tokenized_request():
    params = SamplingParams(max_tokens=9, temperature=0.5, seed=3, stop=("###",), stop_token_ids=(7,), return_logprob=True)
    req = TokenizedReq(req_id=1, input_ids=np.array([5, 6], np.int32), params=params)
    got = SCHEDULER_INBOX.decode(SCHEDULER_INBOX.encode(req))
    assert got.params == params and got.input_ids.tolist() == [5, 6]
    values = msgpack.unpackb(SCHEDULER_INBOX.encode(req))
    values[3][1] = "hot"  # temperature
    with pytest.raises(WireError, match=re.escape("TokenizedReq.params.temperature: Expected `float`, got `str`")):
        SCHEDULER_INBOX.decode(msgpack.packb(values, use_bin_type=True))


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


def test_stats_out_carries_typed_records_and_flattens_to_the_keys_users_see():
    """Each process adds its typed record on the way back; `as_dict()` (what `stats()` returns)
    keeps the flat keys: SchedulerStats fields, detokenizer_states, frontend_*, requests_finished_*
    by finish reason, requests_error_* by code, the info and the histograms."""
    sched = SchedulerStats(num_running=3, new_token_ratio=0.55)
    out = StatsOut(req_id=7, scheduler=sched, histograms={"queue_time_seconds": Histogram.of((0.1, 1.0))})
    got = DETOK_INBOX.decode(DETOK_INBOX.encode(out))
    assert got.scheduler == sched and type(got.scheduler.new_token_ratio) is float
    got.num_detokenizer_states = 2
    got.frontend = FrontendStats(
        num_in_flight=1, is_draining=False, num_finished={FinishReason.LENGTH: 5, FinishReason.ERROR: 2},
        num_errors={ErrorCode.INVALID: 2},
    )
    got.info["model_path"] = "/m"
    final = FRONTEND_TO_CLIENT.decode(FRONTEND_TO_CLIENT.encode(got))
    assert final.frontend.num_finished == {FinishReason.LENGTH: 5, FinishReason.ERROR: 2}
    assert type(next(iter(final.frontend.num_errors))) is ErrorCode
    assert final.as_dict() == {
        **msgspec.structs.asdict(sched), "detokenizer_states": 2, "frontend_in_flight": 1, "frontend_draining": 0,
        "requests_finished_length": 5, "requests_finished_error": 2, "requests_error_invalid": 2, "model_path": "/m",
        "histograms": {"queue_time_seconds": {"bounds": [0.1, 1.0], "counts": [0, 0, 0], "sum": 0.0, "count": 0}},
    }
    refused = StatsOut(req_id=8, code=ErrorCode.UNAUTHORIZED, error="bad key")
    assert FRONTEND_TO_CLIENT.decode(FRONTEND_TO_CLIENT.encode(refused)).as_dict() == {"histograms": {}}


def test_a_forged_outcome_key_is_refused():
    frame = msgpack.packb([tag_of(StatsOut), 1, None, 0, [1, False, {99: 1}, {}]])
    with pytest.raises(WireError, match=re.escape("StatsOut.frontend.num_finished (a key): Invalid enum value 99")):
        FRONTEND_TO_CLIENT.decode(frame)
