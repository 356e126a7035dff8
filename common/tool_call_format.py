"""Which tool-call format a chat template writes: the one rule the launcher (which asks once, for
ModelFacts.tool_call_format, unless --tool-call-parser names one) and the HTTP process (whose
ToolCallParser parses that format) share.

    qwen3_coder  (Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>...`
    hermes       (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
    mistral      (Mistral): `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` or `[TOOL_CALLS]NAME[ARGS]{...}`
    pythonic     (Llama 3.2/4 pythonic templates): `[f(a=1), g()]`
    llama3_json  (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`
"""

from __future__ import annotations

TOOL_CALL_FORMATS = ("hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder")
HERMES_OPEN = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"
PYTHONIC_HINTS = ("[func_name1(", "<|python_start|>")  # vLLM's pythonic templates' instruction; Llama 4's tag


def template_tool_call_format(source: str | None) -> str | None:
    """How a chat template writes tool calls (one of TOOL_CALL_FORMATS); None when it has no
    format we know."""
    if not source:
        return None
    if "<function=" in source and "<parameter=" in source:
        return "qwen3_coder"
    if HERMES_OPEN in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if any(hint in source for hint in PYTHONIC_HINTS):
        return "pythonic"
    if PYTHON_TAG in source or ('"parameters"' in source and "tools" in source):
        return "llama3_json"
    return None
