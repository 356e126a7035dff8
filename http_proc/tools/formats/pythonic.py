"""Pythonic tool calls (Llama 3.2 and 4, vLLM's `pythonic`): the answer is a Python list of calls,

    [get_weather(city="Paris"), add(a=1, b=2)]        (optionally inside <|python_start|>...<|python_end|>)

read with Python's `ast` (`literal_eval` on each keyword's value; never evaluated). Arguments are
the keywords as a JSON object (`json.dumps`), streamed one keyword at a time as each is complete:

    '{"city": "Paris"'  then  '}'        (a prefix of json.dumps({"city": "Paris"}) at each step)

An answer that does not begin with `[name(` is content. A call whose argument is not a literal (or
is positional) ends there: its arguments are those before it, and nothing after it is read.
"""

from __future__ import annotations

import ast
import functools
import json
from typing import Any

from zserve.http_proc.tools.scan import PARTIAL, ParsedCall, ToolScan, expect, held_suffix_len, skip_ws

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
OPENERS, CLOSERS = "([{", ")]}"


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    pos = skip_ws(text, 0)
    started = expect(text, pos, PYTHON_START)
    if started == PARTIAL:
        return ToolScan(text if final else "")
    pos = skip_ws(text, started if isinstance(started, int) else pos)
    opened = expect(text, pos, "[")
    if not isinstance(opened, int):
        return ToolScan(text if final or opened is None else "")
    calls: list[ParsedCall] = []
    pos = opened
    while True:
        pos = skip_ws(text, pos)
        name_end = pos
        while name_end < len(text) and (text[name_end].isalnum() or text[name_end] in "_."):
            name_end += 1
        paren = skip_ws(text, name_end)
        if paren == len(text):
            return ToolScan(text if final and not calls else "", tuple(calls))
        if name_end == pos or text[paren] != "(":
            return ToolScan("" if calls else text, tuple(calls))
        call, end = _read_call(text, text[pos:name_end], paren + 1)
        calls.append(call)
        if end is None:
            return ToolScan("", tuple(calls))
        after = skip_ws(text, end)
        if after < len(text) and text[after] == ",":
            pos = after + 1
            continue
        if after == len(text) or text[after] != "]":
            return ToolScan("", tuple(calls))
        rest = text[after + 1:]
        rest = rest.lstrip().removeprefix(PYTHON_END) if rest.lstrip().startswith(PYTHON_END) else rest
        held = 0 if final else max(held_suffix_len(rest, PYTHON_END), len(rest) - len(rest.rstrip()))
        return ToolScan(rest[:len(rest) - held] if rest.strip() else "", tuple(calls))


def _read_call(text: str, name: str, pos: int) -> tuple[ParsedCall, int | None]:
    """A call's keywords from `pos` (after its `(`): the call (arguments so far) and where it ends
    (after its `)`; None while unfinished, or when a keyword is not a literal)."""
    pairs: list[str] = []
    while True:
        segment_end = _segment_end(text, pos)
        if segment_end is None:
            return ParsedCall(name, "{" + ", ".join(pairs)), None
        segment = text[pos:segment_end].strip()
        if segment:
            pair = _keyword(segment)
            if pair is None:
                return ParsedCall(name, "{" + ", ".join(pairs) + "}"), None
            pairs.append(pair)
        if text[segment_end] == ")":
            return ParsedCall(name, "{" + ", ".join(pairs) + "}"), segment_end + 1
        pos = segment_end + 1


def _segment_end(text: str, pos: int) -> int | None:
    """Index of the `,` or `)` that ends the argument starting at `pos` (outside strings and
    brackets); None when the text ends first."""
    depth, quote, escaped = 0, "", False
    for i in range(pos, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in OPENERS:
            depth += 1
        elif ch in CLOSERS and depth > 0:
            depth -= 1
        elif depth == 0 and ch in ",)":
            return i
    return None


@functools.lru_cache(maxsize=1024)  # a pure function: each streamed prefix re-reads the keywords before it
def _keyword(segment: str) -> str | None:
    """`name=literal` as the JSON `"name": value`; None for anything else."""
    try:
        call = ast.parse(f"f({segment})", mode="eval").body
        [keyword] = call.keywords
        if call.args or keyword.arg is None:
            return None
        return f"{json.dumps(keyword.arg)}: {json.dumps(ast.literal_eval(keyword.value))}"
    except (SyntaxError, ValueError, TypeError):
        return None
