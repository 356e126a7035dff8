"""Which tool-call format a chat template writes: the one rule the launcher (which asks once, for
ModelFacts.tool_call_format) and the HTTP process (whose ToolCallParser parses that format) share.

    hermes       (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
    llama3_json  (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`
"""

from __future__ import annotations

HERMES_OPEN = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"


def template_tool_call_format(source: str | None) -> str | None:
    """How a chat template writes tool calls ("hermes" or "llama3_json"); None when it has no format
    we know."""
    if not source:
        return None
    if HERMES_OPEN in source:
        return "hermes"
    if PYTHON_TAG in source or ('"parameters"' in source and "tools" in source):
        return "llama3_json"
    return None
