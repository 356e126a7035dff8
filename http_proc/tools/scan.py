"""ToolScan: what a tool-call format's scanner reads in a chat answer, complete or still streaming.

Every format (http_proc/tools/formats/*.py) is one function `scan(text, final, tools) -> ToolScan`,
used both for the whole answer (final) and for each streamed prefix of it (not final). The stream
(http_proc/tools/stream.py) sends the differences, so streamed and non-streamed answers agree
by construction. The invariant each scanner keeps, for a prefix p of a text t:

    scan(p).content           is a prefix of scan(t).content
    scan(p).calls[i].name     == scan(t).calls[i].name
    scan(p).calls[i].arguments is a prefix of scan(t).calls[i].arguments

so nothing sent is ever taken back: text that may still turn out to be a call is held, and a call
is announced only once its name is certain.

Also here: the small JSON helpers the JSON formats share (a call's `{"name": ..., "arguments": `
head, where a JSON value ends, how much of a text may be the start of a marker).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object; while streaming, a prefix of the final text


@dataclass(frozen=True, slots=True)
class ToolScan:
    content: str  # the answer's text outside calls, as far as it is settled
    calls: tuple[ParsedCall, ...] = ()


PARTIAL = "partial"  # the text ended where a match could still go on


def held_suffix_len(text: str, marker: str) -> int:
    """Characters at the end of `text` that may be the start of `marker` (held back while streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def expect(text: str, pos: int, literal: str) -> int | str | None:
    """Position after `literal` at `pos`, PARTIAL when the text ends inside it, None when it differs."""
    rest = text[pos:pos + len(literal)]
    if rest == literal:
        return pos + len(literal)
    return PARTIAL if literal.startswith(rest) and pos + len(rest) == len(text) else None


def call_head(text: str, pos: int, argument_keys: tuple[str, ...]) -> tuple[str, int] | str | None:
    """A JSON call's head at `pos`: `{"name": "NAME", "<argument key>": ` up to the `{` that starts
    the arguments. (name, position of that `{`); PARTIAL when the text ends inside a head that may
    still match; None when it does not (another key order, a name with escapes, arguments that are
    not an object: the caller may still read the whole block as JSON)."""
    pos = skip_ws(text, pos)
    steps: list[str | tuple[str, ...]] = ["{", '"name"', ":", "NAME", ",", argument_keys, ":"]
    name = ""
    for step in steps:
        pos = skip_ws(text, pos)
        if pos == len(text):
            return PARTIAL
        if step == "NAME":
            if text[pos] != '"':
                return None
            end = text.find('"', pos + 1)
            name = text[pos + 1:len(text) if end < 0 else end]
            if "\\" in name:
                return None
            if end < 0:
                return PARTIAL
            pos = end + 1
            continue
        options = [f'"{key}"' for key in step] if isinstance(step, tuple) else [step]
        results = [expect(text, pos, option) for option in options]
        matched = [r for r in results if isinstance(r, int)]
        if matched:
            pos = matched[0]
        elif PARTIAL in results:
            return PARTIAL
        else:
            return None
    pos = skip_ws(text, pos)
    if pos == len(text):
        return PARTIAL
    return (name, pos) if text[pos] == "{" else None


def json_value_end(text: str, pos: int) -> int | None:
    """Where the JSON object or array starting at `pos` ends (after its closing bracket); None when
    the text ends first. Strings and escapes are skipped, so brackets inside them do not count."""
    depth, in_string, escaped = 0, False, False
    for i in range(pos, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def loads_call(raw: str, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """A whole JSON call `{"name": ..., "<argument key>": {...}}` in any key order, its arguments
    re-serialised; None when it is not one."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = next((data[k] for k in argument_keys if k in data), {})
    return ParsedCall(data["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


# read(text, start, head_limit) -> (the block's call, or None when the block is not one, or PARTIAL
# when the text ends before that is known; where the call's own text ends, None while unfinished).
# The call's head is read before head_limit (the first close tag): a head never holds one.
BlockReader = Callable[[str, int, int], "tuple[ParsedCall | str | None, int | None]"]


def scan_blocks(
    text: str, final: bool, open_tag: str, close_tag: str, read: BlockReader,
    whole: Callable[[str], ParsedCall | None],
) -> ToolScan:
    """A format whose calls are `open_tag ... close_tag` blocks among text (Hermes, Qwen3-Coder).

        text <open> head arguments <close> text <open> ... <close> ...
                    ^start          ^end   ^close

    `read` reads a block incrementally (its arguments may hold the close tag, inside a JSON
    string); a block it does not take is given whole to `whole` once closed (a call in another
    shape, say another key order), else it stays text. A block the answer ends inside
    (max_tokens) is text unless its call was already announced."""
    outside: list[str] = []
    calls: list[ParsedCall] = []
    view = text if final else text[:len(text) - held_suffix_len(text, close_tag)]
    pos = 0
    while True:
        at = text.find(open_tag, pos)
        if at < 0:
            tail = text[pos:]
            outside.append(tail if final else tail[:len(tail) - held_suffix_len(tail, open_tag)])
            break
        outside.append(text[pos:at])
        start = at + len(open_tag)
        close = text.find(close_tag, start)
        got, end = read(view, start, close if close >= 0 else len(view))
        if isinstance(got, ParsedCall):
            calls.append(got)
            close = -1 if end is None else text.find(close_tag, end)
            if close < 0:
                break
        elif close < 0:  # not (yet) a call and not closed: text at the end, held while streaming
            if final:
                outside.append(text[at:])
            break
        else:
            call = whole(text[start:close])
            if call is not None:
                calls.append(call)
            else:
                outside.append(text[at:close + len(close_tag)])
        pos = close + len(close_tag)
    return ToolScan("".join(outside), tuple(calls))
