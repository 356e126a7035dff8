"""Mistral tool calls, after the `[TOOL_CALLS]` token:

    text [TOOL_CALLS][{"name": "NAME", "arguments": {...}}, ...]          (tokenizers v3-v7)
    text [TOOL_CALLS]NAME[ARGS]{...}[TOOL_CALLS]NAME[ARGS]{...}           (v11 and later)

The text before the first marker is content. Both markers are special tokens: they reach the
answer when the request sends `skip_special_tokens: false` (as vLLM's mistral parser sets); with
them stripped, an answer that begins with the JSON list `[{"name": ...` is still read as calls.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.tools.json_calls import read_json_list
from zserve.http_proc.tools.scan import (
    PARTIAL,
    ParsedCall,
    ToolScan,
    expect,
    held_suffix_len,
    json_value_end,
    skip_ws,
)

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    outside: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    bare = expect(text, skip_ws(text, 0), '[{"name"')  # the list with its marker stripped
    if bare == PARTIAL and not final:
        return ToolScan("")
    marked = isinstance(bare, int)
    if marked:
        text = MARK + text  # read as if marked; the marker added is taken out of the content again
    while True:
        at = text.find(MARK, pos)
        if at < 0:
            tail = text[pos:]
            outside.append(tail if final else tail[:len(tail) - held_suffix_len(tail, MARK)])
            break
        outside.append(text[pos:at])
        start = skip_ws(text, at + len(MARK))
        read = read_json_list if text.startswith("[", start) else _read_named
        got, end = read(text, start, calls)
        if got == PARTIAL:
            if final and end is None:
                outside.append(text[at:])
            break
        if got is None:  # not calls: the marker and what follows stay text
            outside.append(text[at:start])
            pos = start
            continue
        if end is None:
            break
        pos = end
    content = "".join(outside)
    return ToolScan(content.removeprefix(MARK) if marked else content, tuple(calls))


def _read_named(text: str, start: int, calls: list[ParsedCall]) -> tuple[str | bool | None, int | None]:
    """`NAME[ARGS]{...}`: (True, end) read (None while unfinished), (PARTIAL, None), or (None, None)."""
    end = start
    while end < len(text) and text[end] in NAME_CHARS:
        end += 1
    if end == len(text):
        return PARTIAL, None
    args = expect(text, end, ARGS)
    if args == PARTIAL:
        return PARTIAL, None
    if args is None or end == start:
        return None, None
    args_start = skip_ws(text, args)
    if args_start == len(text):
        return PARTIAL, None
    if text[args_start] != "{":
        return None, None
    value_end = json_value_end(text, args_start)
    calls.append(ParsedCall(text[start:end], text[args_start:len(text) if value_end is None else value_end]))
    return True, value_end
