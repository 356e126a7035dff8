"""FutureTokens and rank 0's loop under overlap scheduling: the ids a step sampled fill the next step's future
tokens, before the forward and before the batch goes to the other ranks; a batch naming any other step, a row
outside it or a row it did not sample is refused with a reason, and the worker serves on."""

from __future__ import annotations

import numpy as np
import pytest

from zserve.common.forward_batch import NO_TOKEN, ForwardBatch, SamplingArrays, StepResult, future_token
from zserve.common.messages import RANK_BROADCAST, WorkerError
from zserve.model_proc.future_tokens import FutureTokens
from zserve.model_proc.worker_process import lead


def decode_batch(step_id: int, input_ids: list[int]) -> ForwardBatch:
    n = len(input_ids)
    return ForwardBatch(
        step_id=step_id, input_ids=np.array(input_ids, np.int32), cached_lens=np.full(n, 4, np.int32),
        extend_lens=np.ones(n, np.int32), page_ids=np.arange(n, dtype=np.int32), num_pages=np.ones(n, np.int32),
        is_sampled=np.ones(n, np.bool_), return_logprob=np.zeros(n, np.bool_), sampling=SamplingArrays.greedy(n),
    )


def result(step_id: int, token_ids: list[int]) -> StepResult:
    return StepResult(step_id=step_id, next_token_ids=np.array(token_ids, np.int32),
                      logprobs=np.zeros(len(token_ids), np.float32))


def test_future_tokens_are_the_ids_the_step_before_sampled():
    future = FutureTokens()
    plain = decode_batch(3, [11, 12])
    assert future.fill(plain) is plain  # nothing to fill: the batch itself, no copy
    future.remember(result(3, [40, 41, NO_TOKEN]))
    filled = future.fill(decode_batch(4, [future_token(1), 99, future_token(0)]))
    assert filled.input_ids.tolist() == [41, 99, 40] and filled.step_id == 4


@pytest.mark.parametrize("step_id, ids, message", [
    (5, [future_token(0)], "feeds tokens of step 4, but the last step this worker ran is 3"),
    (4, [future_token(3)], "the token of row 3 of step 3, which had 3 rows"),
    (4, [future_token(2)], "a row step 3 did not sample"),
])
def test_a_batch_naming_another_step_or_row_is_refused(step_id, ids, message):
    future = FutureTokens()
    future.remember(result(3, [40, 41, NO_TOKEN]))
    with pytest.raises(ValueError, match=message):
        future.fill(decode_batch(step_id, ids))


def test_nothing_follows_a_refused_step():
    future = FutureTokens()
    future.remember(result(3, [40]))
    future.forget()
    with pytest.raises(ValueError, match="the last step this worker ran is None"):
        future.fill(decode_batch(4, [future_token(0)]))


class ScriptedInbox:
    def __init__(self, batches):
        self.batches = list(batches)

    def recv_frame(self, timeout_ms):
        if not self.batches:
            raise StopIteration
        batch = self.batches.pop(0)
        return RANK_BROADCAST.encode(batch), batch


class Outbox(list):
    def send(self, msg):
        self.append(msg)


class EchoRunner:
    """Samples input id + 100 at each row, and records the ids each forward got."""

    def __init__(self):
        self.seen = []

    def run(self, batch):
        self.seen.append(batch.input_ids.tolist())
        return result(batch.step_id, (batch.input_ids + 100).tolist())


class FramePublisher:
    def __init__(self):
        self.frames = []

    def publish(self, frame, step_id):
        self.frames.append(RANK_BROADCAST.decode(bytes(frame)).input_ids.tolist())


def test_rank_0_fills_the_future_tokens_before_the_forward_and_the_broadcast():
    runner, results, publisher = EchoRunner(), Outbox(), FramePublisher()
    inbox = ScriptedInbox([
        decode_batch(0, [1, 2]),
        decode_batch(1, [future_token(1), future_token(0)]),  # sent before step 0's result came back
        decode_batch(5, [future_token(0)]),  # names step 4, which this worker never ran: refused
        decode_batch(6, [7]),  # the worker serves on
    ])
    with pytest.raises(StopIteration):
        lead(runner, inbox, results, publisher)
    assert runner.seen == [[1, 2], [102, 101], [7]]
    assert publisher.frames == [[1, 2], [102, 101], [7]]  # the other ranks get the filled ids
    assert [type(r) for r in results] == [StepResult, StepResult, WorkerError, StepResult]
    assert "feeds tokens of step 4" in results[2].message and results[2].step_id == 5
