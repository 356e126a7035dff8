"""The chat path's answer in Anthropic's Messages shape: the `message` object, and its stream of events.

    {"id": "msg_...", "type": "message", "role": "assistant", "model", "content": [blocks],
     "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use", "stop_sequence",
     "usage": {"input_tokens", "output_tokens"}}

Blocks: thinking (a --reasoning-parser's reasoning_content), text, tool_use {id, name, input}.
A stream is message_start; per block content_block_start, content_block_delta* (thinking_delta,
text_delta, input_json_delta), content_block_stop; message_delta (stop_reason, usage); message_stop.
The input token count is known only at the end: message_start says 0, message_delta the count.

Stop sequences: the chat request keeps the stop string in its text (no_stop_trim), so the answer
names the one that ended it and trims it; a stream holds back the last characters that may be
one until the next text or the end. Streamed tool calls accumulate per chat `index`, whole or in pieces.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from zserve.http_proc.apis.openai.chat_chunks import ChatChunkWalk, ChatPiece
from zserve.http_proc.shared.anthropic_error import anthropic_error_body
from zserve.http_proc.shared.api_error import ApiError

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}  # anything else: end_turn (or stop_sequence)


def stop_reason_of(finish_reason: str | None) -> str:
    return STOP_REASONS.get(finish_reason or "", "end_turn")


def matched_stop(text: str, finish_reason: str | None, stop_sequences: list[str]) -> str | None:
    """The stop sequence that ended `text` (kept in it by no_stop_trim), None if none did."""
    if finish_reason != "stop":
        return None
    return next((s for s in sorted(stop_sequences, key=len, reverse=True) if s and text.endswith(s)), None)


@dataclass
class MessageEnvelope:
    model_name: str
    stop_sequences: list[str] = field(default_factory=list)
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None,
                usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_name, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def from_chat(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The `message` for a `chat.completion` body."""
        choice = chat["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        text = message.get("content") or ""
        stop = matched_stop(text, choice["finish_reason"], self.stop_sequences)
        text = text[: len(text) - len(stop)] if stop else text
        if text:
            content.append({"type": "text", "text": text})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            content.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                            "input": json.loads(function["arguments"] or "{}")})
        reason = "stop_sequence" if stop else stop_reason_of(choice["finish_reason"])
        return self.message(content, reason, stop, usage_of(chat.get("usage")))


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    if chat_usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage["completion_tokens"]}


class MessagesStream:
    """Chat chunks in, Messages events out (dicts; named_sse frames them)."""

    def __init__(self, envelope: MessageEnvelope):
        self.envelope = envelope
        self.num_blocks = 0
        self.open_kind: str | None = None  # "thinking" | "text" | "tool_use": the block being streamed
        self.call_blocks: dict[int, int] = {}  # chat tool-call index -> its block index
        self.held = ""  # text that may be (the start of) a stop sequence, not sent yet
        self.hold_len = max((len(s) for s in envelope.stop_sequences), default=0)
        self.chat = ChatChunkWalk()  # the finish reason and the usage

    def opening(self) -> list[dict[str, Any]]:
        message = self.envelope.message([], None, None, {"input_tokens": 0, "output_tokens": 0})
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for piece in self.chat.pieces(chunk):
            if piece.kind == "thinking":
                events += self._delta("thinking", {"type": "thinking_delta", "thinking": piece.text})
            elif piece.kind == "text":
                events += self._text(piece.text)
            else:
                events += self._call(piece)
        return events

    def error_event(self, error: ApiError) -> dict[str, Any]:
        """A failure mid-stream: Anthropic's error event."""
        return anthropic_error_body(error.status, error.message)

    def closing(self) -> list[dict[str, Any]]:
        stop = matched_stop(self.held, self.chat.finish_reason, self.envelope.stop_sequences)
        rest = self.held[: len(self.held) - len(stop)] if stop else self.held
        self.held = ""
        events = self._delta("text", {"type": "text_delta", "text": rest}) if rest else []
        events += self._close()
        reason = "stop_sequence" if stop else stop_reason_of(self.chat.finish_reason)
        return [*events, {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop},
                          "usage": usage_of(self.chat.usage)}, {"type": "message_stop"}]

    # ---- pieces ------------------------------------------------------------------------------

    def _text(self, text: str) -> list[dict[str, Any]]:
        held = self.held + text
        cut = max(len(held) - self.hold_len, 0)
        self.held, sent = held[cut:], held[:cut]
        return self._delta("text", {"type": "text_delta", "text": sent}) if sent else []

    def _call(self, piece: ChatPiece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.call_idx not in self.call_blocks:
            if self.held:  # the text before the call (a stop sequence ends the answer: it cannot be one)
                events += self._delta("text", {"type": "text_delta", "text": self.held})
                self.held = ""
            block = {"type": "tool_use", "id": piece.call_id, "name": piece.name, "input": {}}
            events += self._start("tool_use", block)
            self.call_blocks[piece.call_idx] = self.num_blocks - 1
        if piece.text:  # (to its own block: the anthropic SDK accumulates by index)
            events.append({"type": "content_block_delta", "index": self.call_blocks[piece.call_idx],
                           "delta": {"type": "input_json_delta", "partial_json": piece.text}})
        return events

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open_kind != kind:
            empty = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            events += self._start(kind, empty)
        return [*events, {"type": "content_block_delta", "index": self.num_blocks - 1, "delta": delta}]

    def _start(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.open_kind = kind
        self.num_blocks += 1
        return [*events, {"type": "content_block_start", "index": self.num_blocks - 1, "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]
