"""Tells a client at once when the server's end of its connection closes.

The heartbeat finds a server that stopped answering only after `server_timeout_s` of silence
(15 s by default: a busy frontend must not look dead). A process that exits is different: its
TCP connections close, and a ZMQ socket monitor reports EVENT_DISCONNECTED within milliseconds.
So each client watches its own socket, and once a connection it had is lost, fails every
request still waiting with ServerGoneError naming that cause, without waiting out the heartbeat.
(The frontend process owns the client port; when the launcher or the frontend is killed, the
frontend's socket closes, so both show up here.)
"""

from __future__ import annotations

import zmq
from zmq.utils.monitor import parse_monitor_message

EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED


def lost_message(address: str) -> str:
    return (f"the server at {address} closed the connection: its frontend process exited (the server was "
            f"stopped, or it or the launcher died; see the server's log)")


class ConnectionWatch:
    """Reads `sock`'s monitor events; `lost` turns True once a connection it had is gone."""

    def __init__(self, sock: zmq.Socket):
        self.monitor = sock.get_monitor_socket(EVENTS)
        self.connected = False
        self.lost = False

    def on_event(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.lost = True

    def poll(self) -> bool:
        """Sync sockets: read the events that arrived; returns `lost`."""
        while self.monitor.poll(0):
            self.on_event(self.monitor.recv_multipart())
        return self.lost

    def close(self) -> None:
        self.monitor.close(linger=0)
