"""Outbox: an endpoint double for a process loop under test (the detokenizer's to_frontend, the
frontend's to_scheduler): it keeps what is sent, after a trip through the socket's codec when one is given."""

from __future__ import annotations


class Outbox:
    def __init__(self, codec=None):
        self.codec = codec
        self.sent: list = []

    def send(self, msg) -> None:
        self.sent.append(msg if self.codec is None else self.codec.decode(self.codec.encode(msg)))
