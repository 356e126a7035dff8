"""Rank 0 -> follower broadcast over real ZMQ sockets in one process: every batch once and in
order, heartbeats, clean and failed stops, silence, and a follower that goes away."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from zserve.common.forward_batch import ForwardBatch, SamplingArrays
from zserve.common.messages import WORKER_INBOX
from zserve.model_proc.batch_broadcast import BatchPublisher, BatchSubscriber, FollowerLost, RankZeroLost


def frame(step_id: int) -> bytes:
    i32 = lambda xs: np.asarray(xs, np.int32)  # noqa: E731
    batch = ForwardBatch(
        step_id=step_id, input_ids=i32([5, 6, 7]), cached_lens=i32([0]), extend_lens=i32([3]), page_ids=i32([0]),
        num_pages=i32([1]), is_sampled=np.ones(1, bool), return_logprob=np.zeros(1, bool), sampling=SamplingArrays.greedy(1),
    )
    return WORKER_INBOX.encode(batch)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def group(ctx, tmp_path):
    address = f"ipc://{tmp_path}/ranks.sock"
    publisher = BatchPublisher(ctx, address, num_followers=2)
    followers = [BatchSubscriber(ctx, address) for _ in range(2)]
    publisher.wait_for_followers(timeout_s=5)
    return publisher, followers


def test_every_follower_gets_every_batch_once_in_order(group):
    publisher, followers = group
    for step_id in (1, 2, 3):
        publisher.publish(frame(step_id), step_id)
        publisher.heartbeat()  # skipped by next_batch
    for follower in followers:
        batches = [follower.next_batch(silence_timeout_s=2) for _ in range(3)]
        assert [b.step_id for b in batches] == [1, 2, 3]
        np.testing.assert_array_equal(batches[0].input_ids, [5, 6, 7])
    publisher.close(None)
    assert [f.next_batch(silence_timeout_s=2) for f in followers] == [None, None]


def test_a_failed_rank_0_fails_its_followers(group):
    publisher, followers = group
    publisher.close("FollowerLost: boom")
    with pytest.raises(RankZeroLost, match="rank 0 failed: FollowerLost: boom"):
        followers[0].next_batch(silence_timeout_s=2)


def test_silence_from_rank_0_ends_a_waiting_follower(group):
    _, followers = group
    with pytest.raises(RankZeroLost, match="no batch or heartbeat from rank 0"):
        followers[0].next_batch(silence_timeout_s=0.3)


def test_a_follower_that_leaves_fails_rank_0(group):
    publisher, followers = group
    publisher.check_followers()
    followers[1].close()
    with pytest.raises(FollowerLost, match="disconnected"):
        for _ in range(50):  # the unsubscription arrives asynchronously
            publisher.publish(frame(1), 1)
            zmq.select([publisher.socket], [], [], 0.05)


def test_rank_0_waits_for_every_follower(ctx, tmp_path):
    publisher = BatchPublisher(ctx, f"ipc://{tmp_path}/r.sock", num_followers=2)
    follower = BatchSubscriber(ctx, f"ipc://{tmp_path}/r.sock")  # noqa: F841 (kept open)
    with pytest.raises(FollowerLost, match="only 1 of 2 follower ranks connected"):
        publisher.wait_for_followers(timeout_s=0.5)
