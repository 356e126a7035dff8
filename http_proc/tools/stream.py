"""ToolCallStream: one streamed chat choice's tool calls, sent as vLLM sends them.

Each event the formatter feeds the answer so far; the stream scans it (the parser's `scan`, the
same one the non-streamed answer uses) and returns one delta of what is new, made of these parts
(one chunk per event, as before tools: a call's announcement and its first argument piece may be
two `tool_calls` entries of the same index in one delta, which clients accumulate by index):

    {"content": "Let me check."}                                         text before a call
    {"tool_calls": [{"index": 0, "id": "call_..", "type": "function",
                     "function": {"name": "add", "arguments": ""}}]}      a call, once, when its name is known
    {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"a\\": 1"}}]}  its arguments as they are written

The scan never takes back what it returned (http_proc/tools/scan.py), so the argument pieces of a
call concatenate to its non-streamed `arguments`, and the content to the non-streamed content.
The formatter owns one per streamed choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from zserve.http_proc.tools.parser import new_call_id
from zserve.http_proc.tools.scan import ToolScan


class ToolScanner(Protocol):
    def scan(self, text: str, final: bool) -> ToolScan: ...


@dataclass(slots=True)
class ToolCallStream:
    parser: ToolScanner
    content_sent_len: int = 0  # characters of the content sent
    call_ids: list[str] = field(default_factory=list)  # one per call announced
    arguments_sent_lens: list[int] = field(default_factory=list)  # characters of each call's arguments sent

    @property
    def made_calls(self) -> bool:
        return bool(self.call_ids)

    def feed(self, text: str, final: bool) -> dict[str, Any]:
        """The delta for the answer so far (`text`, all of it; `final`: the answer is done): new
        content, then the tool-call entries in order (a call's announcement and its first argument
        piece may both come in one delta, as two entries of the same index); {} when nothing is new."""
        scan = self.parser.scan(text, final)
        # trailing whitespace is held until more text follows; without calls the answer is all content
        content = text if final and not scan.calls else scan.content.rstrip()
        delta: dict[str, Any] = {}
        if len(content) > self.content_sent_len:
            delta["content"] = content[self.content_sent_len:]
            self.content_sent_len = len(content)
        entries: list[dict[str, Any]] = []
        for idx, call in enumerate(scan.calls):
            if idx == len(self.call_ids):
                self.call_ids.append(new_call_id())
                self.arguments_sent_lens.append(0)
                entries.append({
                    "index": idx, "id": self.call_ids[idx], "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                })
            piece = call.arguments[self.arguments_sent_lens[idx]:]
            if piece:
                entries.append({"index": idx, "function": {"arguments": piece}})
                self.arguments_sent_lens[idx] = len(call.arguments)
        if entries:
            delta["tool_calls"] = entries
        return delta
