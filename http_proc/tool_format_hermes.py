"""Hermes tool calls (Qwen2.5, Qwen3, Hermes; SGLang's `qwen25`):

    any text <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call> ... more blocks

The text outside the blocks is the content. A block's arguments stream as the model writes them
(their JSON text, verbatim); a block in another shape that still parses as a JSON call (another
key order) is taken whole once closed; anything else stays text.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.tool_scan import ParsedCall, ToolScan, call_head, json_value_end, loads_call, scan_blocks

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    return scan_blocks(text, final, OPEN, CLOSE, read_json_call, lambda raw: loads_call(raw, ARGUMENT_KEYS))


def read_json_call(text: str, start: int, closed: bool) -> ParsedCall | str | None:
    """The call of a block holding `{"name": ..., "arguments": {...}}` (also used by Mistral's
    and Llama's JSON): announced once the head is read, its arguments as far as written."""
    head = call_head(text, start, ARGUMENT_KEYS)
    if not isinstance(head, tuple):
        return head
    name, args_start = head
    end = json_value_end(text, args_start)
    return ParsedCall(name, text[args_start:len(text) if end is None else end])
