"""ToolCallParser: function calls in a chat model's text, as OpenAI's `tool_calls`.

One scanner per format (http_proc/tools/formats/*.py; the names are vLLM's and SGLang's):
- hermes (Qwen2.5, Qwen3, Hermes; SGLang's qwen25): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- llama3_json (Llama 3.1-3.3): the whole answer `{"name": ..., "parameters": {...}}` (after an optional
  `<|python_tag|>`), or several separated by `;`;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` or `[TOOL_CALLS]name[ARGS]{...}`;
- qwen3_coder: `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>...</function>\\n</tool_call>`,
  values typed by the tool's schema;
- pythonic (Llama 3.2/4): `[f(a=1, b="x"), g()]`, read with `ast`, never evaluated.

The format comes from --tool-call-parser, else from the chat template (common/tool_call_format.py).
A block that is not a call in its format stays text: a model that writes something else is not
made to have called a tool. The same scan reads the whole answer and each streamed prefix of it
(http_proc/tools/scan.py), so streamed arguments concatenate to the non-streamed ones. Arguments
are the JSON text the model wrote (JSON formats), or the JSON of the values read (the others).
Content: the text outside the calls, trailing whitespace dropped, null when nothing is left; an
answer without calls is all content, as written. Under `parallel_tool_calls: false`
(`single_call()`) only the first call is kept; the text of the others is dropped with them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from zserve.common.tool_call_format import TOOL_CALL_FORMATS, template_tool_call_format
from zserve.http_proc.tools.formats import hermes, llama3_json, mistral, pythonic, qwen3_coder
from zserve.http_proc.tools.scan import ToolScan

Scanner = Callable[[str, bool, tuple[dict[str, Any], ...]], ToolScan]
SCANNERS: dict[str, Scanner] = {
    "hermes": hermes.scan,
    "llama3_json": llama3_json.scan,
    "mistral": mistral.scan,
    "pythonic": pythonic.scan,
    "qwen3_coder": qwen3_coder.scan,
}
assert tuple(SCANNERS) == TOOL_CALL_FORMATS, "one scanner per format common/tool_call_format.py names"


@dataclass(frozen=True)
class ToolCallParser:
    kind: str  # one of TOOL_CALL_FORMATS
    parallel: bool = True  # False: only the answer's first call is kept
    tools: tuple[dict[str, Any], ...] = ()  # the request's tools (qwen3_coder types values by their schemas)

    def __post_init__(self) -> None:
        if self.kind not in SCANNERS:
            raise ValueError(f"tool-call format must be one of {', '.join(SCANNERS)}, got {self.kind!r}")

    @staticmethod
    def for_template(source: str | None) -> ToolCallParser | None:
        """The parser a chat template's tool format needs; None when it has no format we know."""
        return ToolCallParser.for_format(template_tool_call_format(source))

    @staticmethod
    def for_format(kind: str | None) -> ToolCallParser | None:
        """The parser of a tool-call format (ModelFacts.tool_call_format); None for none."""
        return None if kind is None else ToolCallParser(kind)

    @property
    def needs_special_tokens(self) -> bool:
        """Whether the calls' markers are special tokens, kept in the text for this parser
        (Mistral's [TOOL_CALLS] and [ARGS]; the request's skip_special_tokens is set false)."""
        return self.kind == "mistral"

    def single_call(self) -> ToolCallParser:
        """This parser keeping only the first call (parallel_tool_calls false)."""
        return replace(self, parallel=False)

    def with_tools(self, tools: list[dict[str, Any]]) -> ToolCallParser:
        """This parser reading calls to a request's `tools`."""
        return replace(self, tools=tuple(tools))

    def scan(self, text: str, final: bool) -> ToolScan:
        """The answer so far (`final`: all of it) read in this format (http_proc/tools/scan.py)."""
        scan = SCANNERS[self.kind](text, final, self.tools)
        return scan if self.parallel else ToolScan(scan.content, scan.calls[:1])

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls in OpenAI's shape); content None when only calls were written."""
        scan = self.scan(text, True)
        if not scan.calls:
            return text, []
        return scan.content.rstrip() or None, [tool_call(c.name, c.arguments) for c in scan.calls]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """One call in OpenAI's shape (arguments as JSON text, as OpenAI sends them)."""
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }
