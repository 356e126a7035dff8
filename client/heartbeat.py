"""The sync client's heartbeat: a thread with its own socket, so the server can tell a live
client that is busy (or slow to read its stream) from one whose process died."""

from __future__ import annotations

import threading
import time

import zmq

from zserve.common.messages import CLIENT_TO_FRONTEND, FRONTEND_TO_CLIENT, Heartbeat, HeartbeatAck


class HeartbeatThread:
    def __init__(self, ctx: zmq.Context, address: str, client_id: str, interval_s: float, api_key: str = ""):
        self.address = address
        self.client_id = client_id
        self.api_key = api_key
        self.interval_s = interval_s
        self.last_ack_s = time.monotonic()
        self._ctx = ctx
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zserve-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        try:
            while not self._stop.is_set():
                sock.send(CLIENT_TO_FRONTEND.encode(Heartbeat(self.client_id, self.api_key)))
                deadline = time.monotonic() + self.interval_s
                while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0 and not self._stop.is_set():
                    if sock.poll(min(left_ms, 100)):
                        if isinstance(FRONTEND_TO_CLIENT.decode(sock.recv()), HeartbeatAck):
                            self.last_ack_s = time.monotonic()
        finally:
            sock.close(linger=0)

    def silent_for_s(self) -> float:
        return time.monotonic() - self.last_ack_s

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
