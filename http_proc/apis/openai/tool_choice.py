"""ForcedToolChoice: `tool_choice` `required` or a named function, enforced with structured output.

As vLLM does, the forced answer is plain JSON whatever the chat template's own call format, so
any model (and any template) can be made to call: the grammar is a JSON schema built from the
tools' `parameters`, and the answer parses into OpenAI's `tool_calls` by construction.
- a named function: the answer is that function's arguments (an object of its `parameters`);
- required: the answer is a non-empty array of `{"name": <one of the tools>, "parameters": {...}}`,
  of one item under `parallel_tool_calls: false`.
Streamed as the formats' calls are (http_proc/tools/stream.py): each name once, then the
arguments in pieces as they are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.tools.json_calls import read_json_list
from zserve.http_proc.tools.parser import tool_call
from zserve.http_proc.tools.scan import ParsedCall, ToolScan, skip_ws

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ForcedToolChoice:
    schema: dict[str, Any]  # what the answer must match
    function_name: str | None  # a named function's; None under required

    @staticmethod
    def of(
        tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None, parallel: bool = True,
    ) -> ForcedToolChoice | None:
        """The forced choice a request asks for; None for none/auto (or no tool_choice). A
        choice that names no given tool, or `required` without tools, is a 400. `parallel`
        False: the answer is one call."""
        if tool_choice in (None, "none", "auto"):
            return None
        functions = _functions(tools)
        if tool_choice == "required":
            if not functions:
                raise ApiError(400, "tool_choice required needs tools", param="tool_choice")
            calls = [{
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            } for name, params in functions.items()]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            return ForcedToolChoice(schema if parallel else {**schema, "maxItems": 1}, None)
        name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
        if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
            raise ApiError(
                400,
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if name not in functions:
            raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        return ForcedToolChoice(functions[name], name)

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) as ToolCallParser answers: the calls, or the text when it is not
        the JSON the grammar asked for (an answer cut short by max_tokens before a call began)."""
        scan = self.scan(text, True)
        if not scan.calls:
            return text, []
        return None, [tool_call(c.name, c.arguments) for c in scan.calls]

    def scan(self, text: str, final: bool) -> ToolScan:
        """The answer read as it is written, for the stream too (http_proc/tools/scan.py): under a
        named function all of it is that function's arguments; under required it is the array of
        calls, each announced once its name is read. Arguments are the JSON text written (cut
        short by max_tokens: as far as written, as vLLM sends them)."""
        start = skip_ws(text, 0)
        if start == len(text):
            return ToolScan(text if final else "")
        if self.function_name is not None:
            return ToolScan("", (ParsedCall(self.function_name, text[start:]),))
        calls: list[ParsedCall] = []
        got, _ = read_json_list(text, start, calls) if text[start] == "[" else (None, None)
        if got is True:
            return ToolScan("", tuple(calls))
        return ToolScan(text if final or got is None else "")


def _functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> parameters schema of each function tool."""
    out = {}
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(
                400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", param="tools",
            )
        params = function.get("parameters", ANY_OBJECT)
        if not isinstance(params, dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema (an object)", param="tools")
        out[function["name"]] = params
    return out
