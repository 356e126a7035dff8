"""Rank 0 -> the other tensor-parallel ranks ("followers"): every batch, once, in order.

    scheduler --ForwardBatch frame--> rank 0 --the same bytes--> rank 1 .. N-1
                                             --RankHeartbeat while idle (every 0.5 s)-->
                                             --RankStop when rank 0 stops cleanly-->

Why a ZMQ socket and not a torch.distributed broadcast of the bytes: a follower idle between
batches would sit inside a collective that times out after a while (and with NCCL, busy-waits
on its GPU). On a socket it waits with a deadline instead, so it notices when rank 0 goes
silent (killed, or its machine lost) and exits: a follower on another node never outlives
the server.

Why XPUB rather than PUB: XPUB hands rank 0 each follower's subscription, so rank 0 announces
the worker ready only when every follower will receive the first batch (a PUB silently drops
what it sends before a subscriber has joined), and the unsubscription when a follower's
connection drops, so rank 0 fails at once instead of at its next collective. NODROP turns a
full queue into an error rather than a lost batch.
"""

from __future__ import annotations

import time

import zmq

from zserve.common.forward_batch import ForwardBatch
from zserve.common.messages import RANK_BROADCAST, RankHeartbeat, RankStop
from zserve.common.wire import WireError

HEARTBEAT_INTERVAL_S = 0.5
SILENCE_TIMEOUT_S = 10.0  # a follower exits after hearing nothing from rank 0 this long
SEND_QUEUE_LEN = 1000  # frames queued per follower; rank 0 runs at most one batch ahead of them
SUBSCRIBE, UNSUBSCRIBE = 1, 0  # first byte of the messages an XPUB receives


class FollowerLost(RuntimeError):
    """A follower rank's connection dropped, or it stopped reading."""


class RankZeroLost(RuntimeError):
    """A follower heard nothing from rank 0 for too long."""


class BatchPublisher:
    """Rank 0's end. Sends frames as they are; the followers decode them."""

    def __init__(self, ctx: zmq.Context, address: str, num_followers: int):
        self.address, self.num_followers = address, num_followers
        self.num_subscribed = 0
        self.last_step_id = 0
        self.socket = ctx.socket(zmq.XPUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, not only a topic's first and last
        self.socket.setsockopt(zmq.XPUB_NODROP, 1)
        self.socket.setsockopt(zmq.SNDHWM, SEND_QUEUE_LEN)
        self.socket.bind(address)

    def wait_for_followers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.num_subscribed < self.num_followers:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.socket.poll(left_ms):
                raise FollowerLost(
                    f"only {self.num_subscribed} of {self.num_followers} follower ranks connected to {self.address} "
                    f"within {timeout_s:g}s"
                )
            self._take_subscription()

    def check_followers(self) -> None:
        """Raise FollowerLost if a follower's connection dropped since the last call."""
        while self.socket.poll(0):
            self._take_subscription()
        if self.num_subscribed < self.num_followers:
            raise FollowerLost(
                f"a follower rank disconnected from {self.address} ({self.num_subscribed} of {self.num_followers} left)"
            )

    def publish(self, frame: bytes, step_id: int) -> None:
        self.last_step_id = step_id
        self._send(frame)

    def heartbeat(self) -> None:
        self._send(RANK_BROADCAST.encode(RankHeartbeat(step_id=self.last_step_id)))

    def close(self, error: str | None) -> None:
        """Tell the followers to stop, cleanly when `error` is None (best effort: a full queue
        means they are gone anyway)."""
        try:
            self.socket.send(RANK_BROADCAST.encode(RankStop(error=error)), zmq.NOBLOCK)
            self.socket.close(linger=1000)
        except zmq.ZMQError:
            self.socket.close(linger=0)

    def _send(self, frame: bytes) -> None:
        self.check_followers()
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            raise FollowerLost(
                f"a follower rank stopped reading {self.address} ({SEND_QUEUE_LEN} frames queued)"
            ) from None

    def _take_subscription(self) -> None:
        event = self.socket.recv()
        if event[:1] == bytes([SUBSCRIBE]):
            self.num_subscribed += 1
        elif event[:1] == bytes([UNSUBSCRIBE]):
            self.num_subscribed -= 1


class BatchSubscriber:
    """A follower's end."""

    def __init__(self, ctx: zmq.Context, address: str):
        self.address = address
        self.socket = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)  # never drop on this side: rank 0 bounds the queue
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(address)

    def next_batch(self, silence_timeout_s: float = SILENCE_TIMEOUT_S) -> ForwardBatch | None:
        """The next batch; None when rank 0 stopped cleanly. Raises RankZeroLost when rank 0
        failed, or after `silence_timeout_s` of silence (heartbeats included) while waiting."""
        while True:
            if not self.socket.poll(int(silence_timeout_s * 1000)):
                raise RankZeroLost(f"no batch or heartbeat from rank 0 on {self.address} for {silence_timeout_s:g}s")
            try:
                msg = RANK_BROADCAST.decode(self.socket.recv())
            except WireError as exc:  # rank 0 forwards only frames it decoded, so this is a bug
                raise RuntimeError(f"undecodable frame from rank 0 on {self.address}: {exc}") from exc
            if isinstance(msg, ForwardBatch):
                return msg
            if isinstance(msg, RankStop):
                if msg.error is not None:
                    raise RankZeroLost(f"rank 0 failed: {msg.error}")
                return None

    def close(self) -> None:
        self.socket.close(linger=0)
