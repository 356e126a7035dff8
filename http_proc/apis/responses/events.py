"""The chat path's answer in the Responses API's shape: the `response` object, and its stream of events.

    output  [reasoning item]   the thinking (a --reasoning-parser's reasoning_content)
            [message item]     {"type": "message", content: [{"type": "output_text", text}]}
            [function_call]*   {"type": "function_call", call_id, name, arguments}

A stream is the event sequence the openai SDK accumulates, each with its `sequence_number`:

    response.created, response.in_progress
    per item: response.output_item.added
      message:       response.content_part.added, response.output_text.delta*, response.output_text.done,
                     response.content_part.done
      reasoning:     response.reasoning_text.delta*, response.reasoning_text.done
      function_call: response.function_call_arguments.delta*, response.function_call_arguments.done
    response.output_item.done
    response.completed (response.incomplete when max_output_tokens cut the answer)

Streamed tool calls are accumulated per chat `index`: a call's arguments may come whole or in pieces.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from zserve.http_proc.apis.openai.chat_chunks import ChatChunkWalk, ChatPiece
from zserve.http_proc.apis.responses.protocol import ResponsesRequest
from zserve.http_proc.shared.api_error import ApiError


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [
        {"type": "output_text", "text": text, "annotations": [], "logprobs": []},
    ]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


@dataclass
class ResponseEnvelope:
    """What every `response` object of one request carries besides its output."""

    request: ResponsesRequest
    model_name: str
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        req = self.request
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "model": self.model_name, "output": output, "usage": usage, "incomplete_details": incomplete,
            "error": None, "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "temperature": req.temperature,
            "top_p": req.top_p, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "text": req.text or {"format": {"type": "text"}}, "metadata": req.metadata or {},
            "previous_response_id": None, "store": False, "background": False, "truncation": "disabled",
            "user": req.user,
        }

    def from_chat(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The `response` object for a `chat.completion` body."""
        choice = chat["choices"][0]
        message = choice["message"]
        output = []
        if message.get("reasoning_content"):
            output.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
        if message.get("content"):
            status = "incomplete" if choice["finish_reason"] == "length" else "completed"
            output.append(message_item(new_id("msg"), message["content"], status))
        for call in message.get("tool_calls") or []:
            function = call["function"]
            output.append(function_call_item(new_id("fc"), call["id"], function["name"], function["arguments"],
                                             "completed"))
        return self.response("completed", output, response_usage(chat.get("usage")), choice["finish_reason"])


@dataclass
class OpenItem:
    """An output item being streamed: its index in `output`, id and text so far."""

    kind: str  # "message" | "reasoning" | "function_call"
    output_idx: int
    item_id: str
    text: str = ""  # the message's text, the thinking, or the call's arguments
    call_id: str = ""
    name: str = ""


class ResponsesStream:
    """Chat chunks in, Responses events out (dicts with their sequence numbers)."""

    def __init__(self, envelope: ResponseEnvelope):
        self.envelope = envelope
        self.seq = 0
        self.done: dict[int, dict[str, Any]] = {}  # output index -> the item, once done
        self.open: OpenItem | None = None  # the message or reasoning item being streamed
        self.calls: dict[int, OpenItem] = {}  # chat tool-call index -> its item
        self.chat = ChatChunkWalk()  # the finish reason and the usage

    def opening(self) -> list[dict[str, Any]]:
        created = self.envelope.response("in_progress", [], None)
        return [self.event("response.created", response=created),
                self.event("response.in_progress", response=created)]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events for one chat chunk."""
        events: list[dict[str, Any]] = []
        for piece in self.chat.pieces(chunk):
            if piece.kind == "call":
                events += self._call_delta(piece)
            else:
                events += self._text_delta("reasoning" if piece.kind == "thinking" else "message", piece.text)
        return events

    def closing(self) -> list[dict[str, Any]]:
        """The last events: the open items done, then the whole response."""
        events = self._close_open()
        for item in self.calls.values():
            events += self._close_call(item)
        output = [self.done[idx] for idx in sorted(self.done)]
        done = self.envelope.response("completed", output, response_usage(self.chat.usage), self.chat.finish_reason)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return [*events, self.event(kind, response=done)]

    def error_event(self, error: ApiError) -> dict[str, Any]:
        """A failure mid-stream: the Responses API's error event."""
        return self.event("error", code=error.code, message=error.message, param=error.param)

    # ---- pieces ------------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _next_output_idx(self) -> int:
        return len(self.done) + (self.open is not None) + len(self.calls)  # calls are done only at the end

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open is not None and self.open.kind != kind:
            events += self._close_open()
        if self.open is None:
            item = OpenItem(kind, self._next_output_idx(), new_id("msg" if kind == "message" else "rs"))
            self.open = item
            if kind == "message":
                events.append(self._added(item, message_item(item.item_id, "", "in_progress")))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                events.append(self.event("response.content_part.added", **self._where(item), part=part))
            else:
                events.append(self._added(item, reasoning_item(item.item_id, "")))
        item = self.open
        item.text += text
        if kind == "message":
            return [*events, self.event("response.output_text.delta", **self._where(item), delta=text, logprobs=[])]
        return [*events, self.event("response.reasoning_text.delta", **self._where(item), delta=text)]

    def _call_delta(self, piece: ChatPiece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self.calls.get(piece.call_idx)
        if item is None:
            events += self._close_open()  # the text before the calls is done
            item = OpenItem("function_call", self._next_output_idx(), new_id("fc"), call_id=piece.call_id,
                            name=piece.name)
            self.calls[piece.call_idx] = item
            events.append(self._added(item, function_call_item(item.item_id, item.call_id, item.name, "",
                                                               "in_progress")))
        if piece.text:
            item.text += piece.text
            events.append(self.event("response.function_call_arguments.delta", item_id=item.item_id,
                                      output_index=item.output_idx, delta=piece.text))
        return events

    def _added(self, item: OpenItem, body: dict[str, Any]) -> dict[str, Any]:
        return self.event("response.output_item.added", output_index=item.output_idx, item=body)

    @staticmethod
    def _where(item: OpenItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": item.output_idx, "content_index": 0}

    def _close_open(self) -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        if item.kind == "message":
            part = {"type": "output_text", "text": item.text, "annotations": [], "logprobs": []}
            status = "incomplete" if self.chat.finish_reason == "length" else "completed"
            body = message_item(item.item_id, item.text, status)
            events = [self.event("response.output_text.done", **self._where(item), text=item.text, logprobs=[]),
                      self.event("response.content_part.done", **self._where(item), part=part)]
        else:
            body = reasoning_item(item.item_id, item.text)
            events = [self.event("response.reasoning_text.done", **self._where(item), text=item.text)]
        self.done[item.output_idx] = body
        return [*events, self.event("response.output_item.done", output_index=item.output_idx, item=body)]

    def _close_call(self, item: OpenItem) -> list[dict[str, Any]]:
        body = function_call_item(item.item_id, item.call_id, item.name, item.text, "completed")
        self.done[item.output_idx] = body
        return [
            self.event("response.function_call_arguments.done", item_id=item.item_id, output_index=item.output_idx,
                        arguments=item.text, name=item.name),
            self.event("response.output_item.done", output_index=item.output_idx, item=body),
        ]

