"""Llama 3.1-3.3 JSON tool calls: the whole answer is the calls,

    <|python_tag|>{"name": "NAME", "parameters": {...}}; {"name": ..., "parameters": {...}}

(the tag optional, `arguments` taken for `parameters`). An answer that does not begin with a call
is content; text after the calls that is not another call is content too.
"""

from __future__ import annotations

from typing import Any

from zserve.common.tool_call_format import PYTHON_TAG
from zserve.http_proc.tools.json_calls import read_json_call
from zserve.http_proc.tools.scan import PARTIAL, ParsedCall, ToolScan, expect, skip_ws


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    pos = skip_ws(text, 0)
    tagged = expect(text, pos, PYTHON_TAG)
    if tagged == PARTIAL:
        return ToolScan(text if final else "")
    return scan_json_calls(text, tagged if isinstance(tagged, int) else pos, final, ";")


def scan_json_calls(text: str, pos: int, final: bool, separator: str) -> ToolScan:
    """JSON calls from `pos`, one after another with `separator` between them; the first not a
    call ends them (all of the text is content when there is none)."""
    calls: list[ParsedCall] = []
    while True:
        got, end = read_json_call(text, pos, len(text))  # end: the call object's
        if got == PARTIAL:
            return ToolScan(text if final and not calls else "", tuple(calls))
        if not isinstance(got, ParsedCall):
            return ToolScan(text[pos:] if calls else text, tuple(calls))
        calls.append(got)
        if end is None:
            return ToolScan("", tuple(calls))
        after = skip_ws(text, end)
        if after == len(text):
            return ToolScan("", tuple(calls))
        if text[after] != separator:
            return ToolScan(text[end:], tuple(calls))
        pos = after + 1
