"""The one transport helper every process uses: typed PUSH/PULL endpoints and the address book.

Addresses are per server instance: ipc:// sockets in a private runtime directory made by the
launcher (mode 0700), so two servers on one machine never collide and nothing but the client
port listens on the network.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import zmq

from common.wire import Codec, WireError, WireMessage

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

    @staticmethod
    def in_dir(runtime_dir: str, client: str) -> Addresses:
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

    def send(self, msg: WireMessage) -> None:
        self.socket.send(self.codec.encode(msg), copy=False)

    def recv(self, timeout_ms: int | None = None) -> WireMessage | None:
        """The next well-formed message, or None on timeout. Malformed frames are logged and skipped."""
        while True:
            if timeout_ms is not None and not self.socket.poll(timeout_ms):
                return None
            frame = self.socket.recv(copy=False)
            try:
                return self.codec.decode(frame.bytes)
            except WireError as exc:
                logger.warning("dropped a malformed frame on %s: %s", self.address, exc)

    def recv_nowait(self) -> WireMessage | None:
        return self.recv(timeout_ms=0)

    def close(self) -> None:
        self.socket.close(linger=0)


def push(ctx: zmq.Context, address: str, codec: Codec) -> Endpoint:
    return Endpoint(ctx, zmq.PUSH, address, codec, bind=False)


def pull(ctx: zmq.Context, address: str, codec: Codec) -> Endpoint:
    return Endpoint(ctx, zmq.PULL, address, codec, bind=True)
