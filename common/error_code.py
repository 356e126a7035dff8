"""ErrorCode: whose fault a request's ERROR finish is. An int on the wire, so a client picks its
exception and the HTTP front end its status from the code, never from the message text."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    BUSY = 1  # the scheduler's waiting queue is full: try again later
    INVALID = 2  # the request can never be served as given: validation, a prompt too long, too much KV
    INTERNAL = 3  # the server's fault: a bug, a req_id clash
    GONE = 4  # a server process died; the server is stopping (the launcher's FailAll)
    UNAVAILABLE = 5  # the server stopped answering: a client's own verdict, never sent by the server
    UNAUTHORIZED = 6  # the server has an API key and the client presented another, or none
    SHUTTING_DOWN = 7  # the server is draining (stopping): it finishes what it has and takes nothing new

    @property
    def text(self) -> str:
        return self.name.lower()

    def __str__(self) -> str:
        return self.text
