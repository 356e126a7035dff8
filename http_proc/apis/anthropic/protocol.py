"""The request body of POST /v1/messages (Anthropic's Messages API), translated into a chat request.

    system          a string or text blocks: a system turn first
    messages        content a string or blocks: text; tool_use (assistant) -> tool_calls;
                    tool_result (user) -> a tool turn (before the user's text); thinking blocks dropped
    tools           [{name, description, input_schema}] -> function tools
    tool_choice     {"type": "auto" | "any" | "tool" (name) | "none", disable_parallel_tool_use}
    max_tokens      required; stop_sequences, temperature, top_p, top_k as the chat's
    output_config   format {"type": "json_schema", schema}: the chat's response_format (structured output)
    thinking        {"type": "disabled"}: the chat template's enable_thinking false (Qwen3's); "enabled" keeps the
                    template's default (the budget is not enforced)

A stop sequence is sent with no_stop_trim, so the answer can say which one ended it (AnthropicAnswer
trims it). Images, documents, server tools (web_search, ...) are a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from zserve.http_proc.apis.openai.chat_call import chat_request_of
from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.request_body import RequestModel

BLOCK_KINDS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})


class MessagesRequest(RequestModel):
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # user_id: changes nothing here
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # format {"type": "json_schema", schema}: structured output

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request that answers this one (one choice; the usage chunk when streamed)."""
        tool_choice, parallel = self.chat_tool_choice()
        chat: dict[str, Any] = {
            "model": self.model, "messages": self.chat_messages(), "max_tokens": self.max_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "stop": self.stop_sequences or None, "no_stop_trim": bool(self.stop_sequences),
            "tools": [chat_tool(i, t) for i, t in enumerate(self.tools)] if self.tools else None,
            "tool_choice": tool_choice, "parallel_tool_calls": parallel,
            "chat_template_kwargs": self.template_kwargs(), "response_format": self.response_format(),
            "stream": self.stream,
            "stream_options": {"include_usage": True} if self.stream else None,
        }
        return chat_request_of(chat)

    def chat_messages(self) -> list[dict[str, Any]]:
        out = [{"role": "system", "content": self.system_text()}] if self.system else []
        for i, message in enumerate(self.messages):
            role = message.get("role")
            if role not in ("user", "assistant"):
                raise ApiError(400, f"messages[{i}].role must be user or assistant", param=f"messages[{i}].role")
            content = message.get("content")
            if isinstance(content, str):
                out.append({"role": role, "content": content})
            elif isinstance(content, list):
                out += _turns(i, role, content)
            else:
                raise ApiError(400, f"messages[{i}].content must be a string or a list of blocks",
                               param=f"messages[{i}].content")
        if not self.messages:
            raise ApiError(400, "messages is empty", param="messages")
        return out

    def system_text(self) -> str:
        if isinstance(self.system, str):
            return self.system
        return "\n".join(_block_text(block, "system") for block in self.system)

    def chat_tool_choice(self) -> tuple[str | dict[str, Any] | None, bool | None]:
        """(chat's tool_choice, parallel_tool_calls) for Anthropic's tool_choice."""
        if self.tool_choice is None:
            return None, None
        kind = self.tool_choice.get("type")
        parallel = False if self.tool_choice.get("disable_parallel_tool_use") else None
        if kind in ("auto", "none"):
            return kind, parallel
        if kind == "any":
            return "required", parallel
        if kind == "tool" and isinstance(self.tool_choice.get("name"), str):
            return {"type": "function", "function": {"name": self.tool_choice["name"]}}, parallel
        raise ApiError(400, 'tool_choice.type must be "auto", "any", "none" or "tool" (with a name)',
                       param="tool_choice")

    def response_format(self) -> dict[str, Any] | None:
        """`output_config.format` as the chat's response_format (`effort` changes nothing here)."""
        fmt = (self.output_config or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                           param="output_config.format")
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}

    def template_kwargs(self) -> dict[str, Any] | None:
        kind = (self.thinking or {}).get("type")
        if kind not in (None, "enabled", "disabled", "adaptive"):
            raise ApiError(400, "thinking.type must be enabled, disabled or adaptive", param="thinking.type")
        return {"enable_thinking": False} if kind == "disabled" else None


def chat_tool(idx: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A client tool as a chat function tool; a server tool (a `type` such as web_search_...) is a 400."""
    if tool.get("type") not in (None, "custom"):
        raise ApiError(400, f"tools[{idx}].type {tool.get('type')!r} is not supported by this server (client tools "
                       "only)", param=f"tools[{idx}].type")
    if not isinstance(tool.get("name"), str):
        raise ApiError(400, f"tools[{idx}].name is missing", param=f"tools[{idx}].name")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _turns(idx: int, role: str, blocks: list[Any]) -> list[dict[str, Any]]:
    """One message's blocks as chat turns: tool results first (each a tool turn), then the text and calls.
    A turn of calls alone has content "" (not null): a template that knows no tools still renders it."""
    texts, calls, results = [], [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in BLOCK_KINDS:
            raise ApiError(400, f"messages[{idx}].content: {kind!r} blocks are not supported by this server",
                           param=f"messages[{idx}].content")
        if kind == "text":
            texts.append(_block_text(block, f"messages[{idx}]"))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": arguments}})
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _result_text(idx, block.get("content"))})
    turns = list(results)
    if calls:
        turns.append({"role": role, "content": "".join(texts), "tool_calls": calls})
    elif texts or not results:
        turns.append({"role": role, "content": "".join(texts)})
    return turns


def _result_text(idx: int, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_block_text(block, f"messages[{idx}]") for block in content)
    raise ApiError(400, f"messages[{idx}]: a tool_result's content must be a string or text blocks",
                   param=f"messages[{idx}].content")


def _block_text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise ApiError(400, f"{where}: {kind!r} blocks are not supported here (text only)", param=where)
    return block["text"]
