"""ChatChunkWalk: a streamed chat answer's chunks (`chat.completion.chunk` dicts) as the pieces another API's
events are made of (apis/responses/events.py, apis/anthropic/events.py), in the order they came:

    ChatPiece("thinking", text)                      a reasoning parser's reasoning_content
    ChatPiece("text", text)                          content
    ChatPiece("call", arguments, call_idx, id, name)  a tool call's entry: its announcement (id and name) and/or
                                                     a piece of its arguments; call_idx is the chat `index`
                                                     (a call given without one is the next call)

The walk keeps the last finish reason and the usage (the last chunk's, with no choices). The finish reason of
a choice is taken after its pieces, so a translator reading it mid-chunk sees the earlier one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class ChatPiece:
    kind: Literal["thinking", "text", "call"]
    text: str  # the thinking, the content, or a piece of a call's arguments ("" when none)
    call_idx: int = 0  # a call's: its chat `index`
    call_id: str = ""  # a call's, when it is announced
    name: str = ""  # a call's, when it is announced


@dataclass
class ChatChunkWalk:
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    call_idxs: set[int] = field(default_factory=set)  # the chat indexes of the calls seen

    def pieces(self, chunk: dict[str, Any]) -> Iterator[ChatPiece]:
        """The pieces of one chat chunk (a generator: consume it whole)."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                yield ChatPiece("thinking", delta["reasoning_content"])
            if delta.get("content"):
                yield ChatPiece("text", delta["content"])
            for call in delta.get("tool_calls") or []:
                idx = call.get("index", len(self.call_idxs))
                self.call_idxs.add(idx)
                function = call.get("function") or {}
                yield ChatPiece("call", function.get("arguments") or "", idx, call.get("id") or "",
                                function.get("name") or "")
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
