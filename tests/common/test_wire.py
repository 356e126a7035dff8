import msgpack
import numpy as np
import pytest

from common.batch_messages import ForwardBatchMsg, StepResultMsg
from common.forward_batch import ForwardBatch, SamplingArrays, StepResult
from common.wire import Codec, WireError


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
    codec = Codec(ForwardBatchMsg, StepResultMsg)
    batch = _batch()
    got = codec.decode(codec.encode(ForwardBatchMsg(batch))).batch
    for name in ("input_ids", "cached_lens", "extend_lens", "page_ids", "num_pages", "is_sampled", "return_logprob"):
        np.testing.assert_array_equal(getattr(got, name), getattr(batch, name))
        assert getattr(got, name).dtype == getattr(batch, name).dtype
    np.testing.assert_array_equal(got.sampling.seed, batch.sampling.seed)
    np.testing.assert_array_equal(got.sampling.top_p, batch.sampling.top_p)
    assert got.step_id == 7
    got.validate(page_size=4, num_pages_total=5)


def test_ids_travel_as_raw_bytes_not_lists():
    codec = Codec(ForwardBatchMsg)
    batch = _batch()
    batch.input_ids = np.arange(4096, dtype=np.int32)
    batch.extend_lens = np.array([4095, 1], np.int32)
    frame = codec.encode(ForwardBatchMsg(batch))
    fields = msgpack.unpackb(frame)
    assert isinstance(fields[2], bytes) and len(fields[2]) == 4096 * 4


def test_step_result_round_trip():
    codec = Codec(ForwardBatchMsg, StepResultMsg)
    res = StepResult(3, np.array([42], np.int32), np.array([-0.5], np.float32), forward_ms=1.5)
    got = codec.decode(codec.encode(StepResultMsg(res))).result
    assert got.step_id == 3 and got.next_token_ids.tolist() == [42] and got.logprobs.tolist() == [-0.5]


@pytest.mark.parametrize("frame", [b"", b"\xc1garbage", msgpack.packb({"a": 1}), msgpack.packb([99, 1]), msgpack.packb([1, 2])])
def test_garbage_frames_raise_wire_error(frame):
    with pytest.raises(WireError):
        Codec(ForwardBatchMsg, StepResultMsg).decode(frame)


def test_codec_refuses_messages_the_socket_does_not_carry():
    with pytest.raises(TypeError):
        Codec(StepResultMsg).encode(ForwardBatchMsg(_batch()))


def test_validate_names_the_slot_outside_the_pool():
    batch = _batch()
    batch.page_ids = np.array([4, 0, 1, 9], np.int32)
    with pytest.raises(ValueError, match=r"page id 9 \(slots 36\.\.39\)"):
        batch.validate(page_size=4, num_pages_total=5)


def test_validate_rejects_wrong_page_count():
    batch = _batch()
    with pytest.raises(ValueError, match="request 0 has 1 pages for 3 tokens"):
        batch.validate(page_size=2, num_pages_total=50)
