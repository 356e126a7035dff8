"""Qwen3-Coder tool calls (vLLM's and SGLang's `qwen3_coder`): XML blocks among text,

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

Each VALUE (one newline either side trimmed) is typed by the tool's JSON schema as vLLM's
qwen3_coder parser does: string as written; integer, number, boolean parsed (a number with no
fraction becomes an integer); object/array as JSON (else a Python literal); `null` is null; a
value that does not parse, or a parameter the schema does not list, stays a string. Arguments are
the parameters as a JSON object, streamed one parameter at a time as each `</parameter>` arrives.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from zserve.http_proc.tools.formats.hermes import CLOSE, OPEN
from zserve.http_proc.tools.scan import PARTIAL, ParsedCall, ToolScan, expect, scan_blocks, skip_ws

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


def scan(text: str, final: bool, tools: tuple[dict[str, Any], ...] = ()) -> ToolScan:
    schemas = {
        t["function"]["name"]: t["function"].get("parameters") or {}
        for t in tools if isinstance(t.get("function"), dict) and "name" in t["function"]
    }
    read = lambda view, start, head_limit: _read(view, start, head_limit, schemas)  # noqa: E731
    return scan_blocks(text, final, OPEN, CLOSE, read, lambda _: None)


def _read(text: str, start: int, head_limit: int, schemas: dict[str, dict[str, Any]]) -> tuple[Any, int | None]:
    """(the block's call, where its `</function>` ends); see tool_scan.BlockReader."""
    head = text[:head_limit]
    opened = expect(head, skip_ws(head, start), FUNCTION)
    if not isinstance(opened, int):
        return opened, None
    name_end = head.find(">", opened)
    if name_end < 0:
        return PARTIAL, None
    name = head[opened:name_end].strip()
    if not name or any(ch in name for ch in "<\n"):
        return None, None
    properties = schemas.get(name, {}).get("properties") or {}
    pairs: list[str] = []
    pos = name_end + 1
    while True:
        param_at, end_at = text.find(PARAMETER, pos), text.find(FUNCTION_END, pos)
        if end_at >= 0 and (param_at < 0 or end_at < param_at):
            return ParsedCall(name, "{" + ", ".join(pairs) + "}"), end_at + len(FUNCTION_END)
        param_name_end = text.find(">", param_at) if param_at >= 0 else -1
        value_end = text.find(PARAMETER_END, param_name_end) if param_name_end >= 0 else -1
        if value_end < 0:
            return ParsedCall(name, "{" + ", ".join(pairs)), None
        param = text[param_at + len(PARAMETER):param_name_end].strip()
        value = text[param_name_end + 1:value_end].removeprefix("\n").removesuffix("\n")
        pairs.append(f"{json.dumps(param)}: {json.dumps(typed_value(value, properties.get(param)))}")
        pos = value_end + len(PARAMETER_END)


def typed_value(value: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the type its schema names (vLLM's rules; see the module docstring)."""
    if value.strip().lower() == "null":
        return None
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            number = float(value.strip())
            return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
        if kind == "boolean" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kind in ("object", "array"):
            try:
                return json.loads(value)
            except ValueError:
                return ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, OverflowError):
        return value
    return value
