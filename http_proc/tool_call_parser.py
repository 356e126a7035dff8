"""ToolCallParser: function calls in a chat model's text, as OpenAI's `tool_calls`.

Two formats, picked from the model's chat template (common/tool_call_format.py):
- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  any number of them; the text outside them is the message's content;
- llama3_json (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}`
  (optionally after `<|python_tag|>`), or several separated by `;`.

A block that is not valid JSON with a string `name` stays text: a model that writes something
else is not made to have called a tool. Streaming holds back text from where a call may begin
(`safe_prefix_len`), so a call is never streamed as content. Under `parallel_tool_calls: false`
(`single_call()`) only the first call is kept; the text of the others is dropped with them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from zserve.common.tool_call_format import HERMES_OPEN, PYTHON_TAG, template_tool_call_format

HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class ToolCallParser:
    kind: str  # "hermes" | "llama3_json"
    parallel: bool = True  # False: only the answer's first call is kept

    @staticmethod
    def for_template(source: str | None) -> ToolCallParser | None:
        """The parser a chat template's tool format needs; None when it has no format we know."""
        return ToolCallParser.for_format(template_tool_call_format(source))

    @staticmethod
    def for_format(kind: str | None) -> ToolCallParser | None:
        """The parser of a tool-call format (ModelFacts.tool_call_format); None for none."""
        return None if kind is None else ToolCallParser(kind)

    def single_call(self) -> ToolCallParser:
        """This parser keeping only the first call (parallel_tool_calls false)."""
        return replace(self, parallel=False)

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls in OpenAI's shape); content None when only calls were written."""
        content, calls = self._parse_all(text)
        return content, calls if self.parallel else calls[:1]

    def _parse_all(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        if self.kind == "hermes":
            calls = [c for c in (_call(block, "arguments") for block in HERMES_BLOCK.findall(text)) if c is not None]
            if not calls:
                return text, []
            content = HERMES_BLOCK.sub("", text).strip()
            return content or None, calls
        body = text.strip().removeprefix(PYTHON_TAG).strip()
        calls = [_call(part, "parameters", "arguments") for part in body.split(";")] if body.startswith("{") else [None]
        if not calls or any(c is None for c in calls):
            return text, []
        return None, calls

    def safe_prefix_len(self, text: str) -> int:
        """How much of a streamed answer can go out as content: all of it but what may still
        turn out to be (the start of) a call."""
        if self.kind == "llama3_json":
            stripped = text.lstrip()
            may_be_call = not stripped or stripped[0] == "{" or PYTHON_TAG.startswith(stripped[: len(PYTHON_TAG)])
            return 0 if may_be_call else len(text)
        at = text.find(HERMES_OPEN)
        if at >= 0:
            return at
        for n in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
            if HERMES_OPEN.startswith(text[-n:]):
                return len(text) - n
        return len(text)


def _call(raw: str, *argument_keys: str) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    return tool_call(data["name"], next((data[k] for k in argument_keys if k in data), {}))


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """One call in OpenAI's shape (arguments as JSON text, as OpenAI sends them)."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }
