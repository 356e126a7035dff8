"""JSON tool calls, the pieces the JSON formats share (hermes, llama3_json, mistral, and the forced
tool_choice's answer): one `{"name": ..., "arguments": {...}}` call read as it is written, and a
`[call, call, ...]` list of them.
"""

from __future__ import annotations

import json

from zserve.http_proc.tools.scan import PARTIAL, ParsedCall, call_head, json_value_end, loads_call, skip_ws

ARGUMENT_KEYS = ("arguments", "parameters")


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


def read_json_list(text: str, start: int, calls: list[ParsedCall]) -> tuple[str | bool | None, int | None]:
    """The list `[{"name": ..., "arguments": {...}}, ...]` whose `[` is at `start`, its calls added
    to `calls`, each once its head is read; a list in another shape is taken whole once closed,
    when it parses as calls. (True, where the calls end; None while unfinished), (PARTIAL, None)
    while not yet known, or (None, None): not calls."""
    pos, found = start + 1, []
    while True:
        got, end = read_json_call(text, pos, len(text))
        if not isinstance(got, ParsedCall):
            if found:  # after a call: what is not another call ends the list
                return (True, None) if got == PARTIAL else (True, pos)
            return whole_json_list(text, start, calls)
        found.append(got)
        calls.append(got)
        if end is None:
            return True, None
        after = skip_ws(text, end)
        if after == len(text):
            return True, None
        if text[after] != ",":
            return True, after + 1 if text[after] == "]" else after
        pos = after + 1


def whole_json_list(text: str, start: int, calls: list[ParsedCall]) -> tuple[str | bool | None, int | None]:
    end = json_value_end(text, start)
    if end is None:
        return PARTIAL, None
    try:
        items = json.loads(text[start:end])
    except ValueError:
        return None, None
    parsed = [loads_call(json.dumps(item), ARGUMENT_KEYS) for item in items] if isinstance(items, list) else [None]
    if not parsed or any(p is None for p in parsed):
        return None, None
    calls.extend(parsed)
    return True, end
