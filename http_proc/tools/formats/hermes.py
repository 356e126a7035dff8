"""Hermes tool calls (Qwen2.5, Qwen3, Hermes; SGLang's `qwen25`):

    any text <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call> ... more blocks

The text outside the blocks is the content. A block's arguments stream as the model writes them
(their JSON text, verbatim); a block in another shape that still parses as a JSON call (another
key order) is taken whole once closed; anything else stays text.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.tools.json_calls import ARGUMENT_KEYS, read_json_call
from zserve.http_proc.tools.scan import (
    ToolScan,
    loads_call,
    scan_blocks,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    return scan_blocks(text, final, OPEN, CLOSE, read_json_call, lambda raw: loads_call(raw, ARGUMENT_KEYS))
