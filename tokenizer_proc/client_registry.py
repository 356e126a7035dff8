"""Which client owns which in-flight request, and when each client was last heard from.

Owned by the frontend loop. A req_id belongs to the client that sent it from its admission until
its last output: another client's request naming it is refused (to that client), as is its
abort. A client that stops sending heartbeats (its process died, its network went away) has its
requests aborted after `client_timeout_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ClientEntry:
    identity: bytes  # ZMQ routing id of the client's request socket
    last_seen_s: float
    req_ids: set[int] = field(default_factory=set)
    timed_out: bool = False  # its requests were aborted already; waiting for their last outputs


@dataclass
class ClientRegistry:
    client_timeout_s: float
    clients: dict[str, ClientEntry] = field(default_factory=dict)
    owner_of: dict[int, str] = field(default_factory=dict)  # req_id -> client_id

    def add_request(self, client_id: str, identity: bytes, req_id: int, now_s: float) -> None:
        entry = self.clients.get(client_id)
        if entry is None:
            entry = self.clients[client_id] = ClientEntry(identity, now_s)
        entry.identity = identity
        entry.last_seen_s = now_s
        entry.req_ids.add(req_id)
        self.owner_of[req_id] = client_id

    def identity_of(self, req_id: int) -> bytes | None:
        client_id = self.owner_of.get(req_id)
        return None if client_id is None else self.clients[client_id].identity

    def clash_error(self, client_id: str, req_ids: range) -> str | None:
        """Why a request of `client_id` for `req_ids` (its choices' ids) is refused: one of them is
        held by a request in flight (its own or another client's); None when all are free."""
        clash = next((req_id for req_id in req_ids if req_id in self.owner_of), None)
        if clash is None:
            return None
        whose = "on this client" if self.owns(client_id, clash) else "for another client's request"
        first, last = req_ids[0], req_ids[-1]
        ids = f"req_id {first}" if len(req_ids) == 1 else f"req_ids {first} .. {last} (n={len(req_ids)})"
        return (
            f"req_id {clash} is already in flight {whose}: an id belongs to the client whose request holds it "
            f"until that request ends, so this request ({ids}) is refused"
        )

    def owns(self, client_id: str, req_id: int) -> bool:
        return self.owner_of.get(req_id) == client_id

    def finish(self, req_id: int) -> None:
        client_id = self.owner_of.pop(req_id, None)
        if client_id is None:
            return
        entry = self.clients[client_id]
        entry.req_ids.discard(req_id)
        if not entry.req_ids:
            del self.clients[client_id]

    def heard_from(self, client_id: str, now_s: float) -> None:
        entry = self.clients.get(client_id)
        if entry is not None:
            entry.last_seen_s = now_s

    def silent_requests(self, now_s: float) -> list[int]:
        """Requests of clients newly silent for longer than the timeout (each reported once)."""
        req_ids: list[int] = []
        for entry in self.clients.values():
            if not entry.timed_out and now_s - entry.last_seen_s > self.client_timeout_s:
                entry.timed_out = True
                req_ids.extend(sorted(entry.req_ids))
        return req_ids

    @property
    def num_in_flight(self) -> int:
        return len(self.owner_of)
