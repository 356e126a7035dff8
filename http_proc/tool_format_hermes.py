"""Hermes tool calls (Qwen2.5, Qwen3, Hermes; SGLang's `qwen25`):

    any text <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call> ... more blocks

The text outside the blocks is the content. A block's arguments stream as the model writes them
(their JSON text, verbatim); a block in another shape that still parses as a JSON call (another
key order) is taken whole once closed; anything else stays text.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.tool_scan import (
    ParsedCall,
    ToolScan,
    call_head,
    json_value_end,
    loads_call,
    scan_blocks,
    skip_ws,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    return scan_blocks(text, final, OPEN, CLOSE, read_json_call, lambda raw: loads_call(raw, ARGUMENT_KEYS))


def read_json_call(text: str, start: int, head_limit: int) -> tuple[ParsedCall | str | None, int | None]:
    """The call of a block holding `{"name": ..., "arguments": {...}}` (also Mistral's and Llama's
    JSON): announced once the head (before `head_limit`) is read, its arguments as far as written;
    and where the call object ends (None while unfinished)."""
    head = call_head(text[:head_limit], start, ARGUMENT_KEYS)
    if not isinstance(head, tuple):
        return head, None
    name, args_start = head
    end = json_value_end(text, args_start)
    call = ParsedCall(name, text[args_start:len(text) if end is None else end])
    return call, None if end is None else json_value_end(text, skip_ws(text, start))
