"""msgpack framing for typed messages. No pickle anywhere: msgpack cannot execute code.

A frame is `msgpack([tag, field0, field1, ...])`. Each socket decodes with a `Codec` built from
the explicit, small set of message classes that socket carries; an unknown tag or a malformed
frame raises `WireError` (the receiving process answers or drops that frame, never crashes).
Message classes implement `TAG: int`, `to_wire() -> list` and `from_wire(list) -> Self`.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack


class WireError(ValueError):
    """A frame that is not one of the messages this socket carries."""


class WireMessage(Protocol):
    TAG: int

    def to_wire(self) -> list[Any]: ...

    @classmethod
    def from_wire(cls, fields: list[Any]) -> WireMessage: ...


class Codec:
    def __init__(self, *classes: type[WireMessage]):
        self._by_tag: dict[int, type[WireMessage]] = {}
        for cls in classes:
            if cls.TAG in self._by_tag:
                raise ValueError(f"tag {cls.TAG} used by both {self._by_tag[cls.TAG].__name__} and {cls.__name__}")
            self._by_tag[cls.TAG] = cls

    def encode(self, msg: WireMessage) -> bytes:
        if self._by_tag.get(msg.TAG) is not type(msg):
            raise TypeError(f"{type(msg).__name__} is not carried by this socket")
        return msgpack.packb([msg.TAG, *msg.to_wire()], use_bin_type=True)

    def decode(self, frame: bytes) -> WireMessage:
        try:
            obj = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise WireError(f"undecodable frame ({len(frame)} bytes): {exc}") from exc
        if not isinstance(obj, list) or not obj or not isinstance(obj[0], int):
            raise WireError(f"frame is not a tagged message list: {type(obj).__name__}")
        cls = self._by_tag.get(obj[0])
        if cls is None:
            raise WireError(f"unknown message tag {obj[0]}")
        try:
            return cls.from_wire(obj[1:])
        except (IndexError, TypeError, ValueError, KeyError) as exc:
            raise WireError(f"malformed {cls.__name__}: {exc}") from exc
