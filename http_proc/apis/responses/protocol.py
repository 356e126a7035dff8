"""The request body of POST /v1/responses (OpenAI's Responses API), translated into a chat request.

    input         a string (one user turn) or a list of items:
                  {"type": "message", role, content: str | [{"type": "input_text" | "output_text", "text"}]}
                  {"type": "function_call", call_id, name, arguments}  -> an assistant turn's tool_calls
                  {"type": "function_call_output", call_id, output}    -> a tool turn
                  {"type": "reasoning", ...}                           -> dropped (templates drop past thinking)
    instructions  a system turn first
    tools         the flat shape {"type": "function", name, description, parameters}
    tool_choice   "auto" | "none" | "required" | {"type": "function", name}
    text.format   {"type": "text" | "json_object" | "json_schema", schema}: the chat's response_format

What the Responses API has and zserve cannot do is a 400 naming the field: a stored conversation
(`previous_response_id`, `conversation`, `store: true`), `background`, built-in tools (web_search, ...),
prompt templates (`prompt`), `include`, `truncation: auto`, and input other than text.
"""

from __future__ import annotations

from typing import Any

from zserve.http_proc.apis.openai.chat_call import chat_request_of
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.request_body import RequestModel

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None  # echoed back, as OpenAI does
    user: str | None = None
    # refused unless off (see the module doc)
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None

    def check_supported(self) -> None:
        refused = {
            "previous_response_id": self.previous_response_id is not None,
            "conversation": self.conversation is not None,
            "store": bool(self.store),
            "background": bool(self.background),
            "prompt": self.prompt is not None,
            "include": bool(self.include),
            "truncation": self.truncation not in (None, "disabled"),
        }
        why = {
            "store": "responses are not stored (send store: false)",
            "truncation": "a prompt longer than the context is refused, not truncated",
        }
        for name, is_refused in refused.items():
            if is_refused:
                reason = why.get(name, "this server keeps no conversations, runs no background jobs nor templates")
                raise ApiError(400, f"{name} is not supported on /v1/responses: {reason}", param=name)

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request that answers this one (one choice; the usage chunk when streamed)."""
        self.check_supported()
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ApiError(400, "max_output_tokens must be at least 1", param="max_output_tokens")
        chat: dict[str, Any] = {
            "model": self.model, "messages": self.messages(), "max_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "user": self.user,
            "tools": [chat_tool(i, t) for i, t in enumerate(self.tools)] if self.tools else None,
            "tool_choice": chat_tool_choice(self.tool_choice), "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self.response_format(), "stream": self.stream,
            "stream_options": {"include_usage": True} if self.stream else None,
        }
        return chat_request_of(chat)

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                out.append(_message(i, item))
            elif kind == "function_call":
                call = {"id": _text(i, item, "call_id"), "type": "function",
                        "function": {"name": _text(i, item, "name"), "arguments": _text(i, item, "arguments")}}
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)  # one assistant turn holds its calls
                else:
                    # content "" (not null): a template that knows no tools still renders the turn
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output")
                text = output if isinstance(output, str) else _parts_text(i, output)
                out.append({"role": "tool", "tool_call_id": _text(i, item, "call_id"), "content": text})
            elif kind != "reasoning":
                raise ApiError(400, f"input[{i}].type {kind!r} is not supported by this server",
                               param=f"input[{i}].type")
        if not out:
            raise ApiError(400, "input is empty", param="input")
        return out

    def response_format(self) -> dict[str, Any] | None:
        """`text.format` as chat's response_format."""
        fmt = (self.text or {}).get("format")
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") == "json_object":
            return {"type": "json_object"}
        if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
            return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "answer"), "schema": fmt["schema"]}}
        raise ApiError(400, "text.format must be text, json_object or json_schema (with a schema)", param="text.format")


def chat_tool(idx: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flat) as a chat tool; built-in tools are a 400."""
    if tool.get("type") != "function":
        raise ApiError(400, f"tools[{idx}].type {tool.get('type')!r} is not supported by this server (only function "
                       "tools)", param=f"tools[{idx}].type")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, 'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
                   param="tool_choice")


def _message(idx: int, item: dict[str, Any]) -> dict[str, Any]:
    role = ROLES.get(item.get("role"))
    if role is None:
        raise ApiError(400, f"input[{idx}].role must be user, assistant, system or developer",
                       param=f"input[{idx}].role")
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(idx, content)
    return {"role": role, "content": text}


def _parts_text(idx: int, parts: Any) -> str:
    if not isinstance(parts, list):
        raise ApiError(400, f"input[{idx}].content must be a string or a list of text parts", param=f"input[{idx}]")
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(400, f"input[{idx}].content: {kind!r} parts are not supported by this server (text only)",
                           param=f"input[{idx}].content")
        texts.append(part["text"])
    return "".join(texts)


def _text(idx: int, item: dict[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise ApiError(400, f"input[{idx}].{name} must be a string", param=f"input[{idx}].{name}")
    return value
