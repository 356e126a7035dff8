"""The one transport helper every process uses: typed PUSH/PULL endpoints and the address book.

Addresses are per server instance: ipc:// sockets in a private runtime directory made by the
launcher (mode 0700), so two servers on one machine never collide and nothing but the client
port listens on the network. The one exception is asked for explicitly: with --nnodes > 1,
the tensor-parallel ranks meet at --dist-init-addr and rank 0 broadcasts batches on the port
after it (common/rank_layout.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import zmq

from zserve.common.wire import Codec, Message, WireError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Addresses:
    runtime_dir: str
    client: str  # tcp://host:port, ROUTER bound by the frontend
    frontend_inbox: str
    scheduler_inbox: str
    detok_inbox: str
    worker_inbox: str
    worker_results: str
    launcher_inbox: str
    rank_broadcast: str = ""  # rank 0 -> other tensor-parallel ranks (XPUB bound by rank 0); ipc, or tcp across nodes
    dist_init: str = ""  # torch.distributed init_method of the tensor-parallel ranks (file:// or tcp://)

    @staticmethod
    def in_dir(runtime_dir: str, client: str, rank_broadcast: str = "", dist_init: str = "") -> Addresses:
        """ipc:// addresses in `runtime_dir`; the two rank addresses default to private ones there
        too (one node); across nodes the launcher gives tcp:// ones from --dist-init-addr."""

        def ipc(name: str) -> str:
            return f"ipc://{runtime_dir}/{name}.sock"

        return Addresses(
            runtime_dir=runtime_dir,
            client=client,
            frontend_inbox=ipc("frontend"),
            scheduler_inbox=ipc("scheduler"),
            detok_inbox=ipc("detokenizer"),
            worker_inbox=ipc("worker"),
            worker_results=ipc("worker-results"),
            launcher_inbox=ipc("launcher"),
            rank_broadcast=rank_broadcast or ipc("ranks"),
            dist_init=dist_init or f"file://{runtime_dir}/dist-store",
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Addresses:
        return Addresses(**json.loads(text))


class Endpoint:
    """A socket plus the codec of the messages it carries."""

    def __init__(self, ctx: zmq.Context, kind: int, address: str, codec: Codec, *, bind: bool):
        self.socket = ctx.socket(kind)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.codec = codec
        self.address = address
        (self.socket.bind if bind else self.socket.connect)(address)

    def send(self, msg: Message) -> None:
        self.socket.send(self.codec.encode(msg), copy=False)

    def recv(self, timeout_ms: int | None = None) -> Message | None:
        """The next well-formed message, or None on timeout. Malformed frames are logged and skipped."""
        got = self.recv_frame(timeout_ms)
        return None if got is None else got[1]

    def recv_frame(self, timeout_ms: int | None = None) -> tuple[bytes, Message] | None:
        """Like `recv`, with the frame's bytes too (rank 0 re-broadcasts them unchanged)."""
        while True:
            if timeout_ms is not None and not self.socket.poll(timeout_ms):
                return None
            frame = self.socket.recv(copy=False).bytes
            try:
                return frame, self.codec.decode(frame)
            except WireError as exc:
                logger.warning("dropped a malformed frame on %s: %s", self.address, exc)

    def recv_nowait(self) -> Message | None:
        return self.recv(timeout_ms=0)

    def close(self) -> None:
        self.socket.close(linger=0)


def push(ctx: zmq.Context, address: str, codec: Codec) -> Endpoint:
    return Endpoint(ctx, zmq.PUSH, address, codec, bind=False)


def pull(ctx: zmq.Context, address: str, codec: Codec) -> Endpoint:
    return Endpoint(ctx, zmq.PULL, address, codec, bind=True)
