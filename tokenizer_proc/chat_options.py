"""ChatOptions: how a request's messages become its prompt, read from its body (untrusted plain values).

    tools                   function definitions the template lists
    continue_final_message  the prompt ends inside the last (assistant) message, its turn left open
    add_generation_prompt   the assistant's turn is opened after the messages (default; vLLM's false: not)
    chat_template           a Jinja template of the request's own instead of the model's (vLLM's), compiled
                            once per source in the same sandbox (RequestTemplates keeps the last few)
    chat_template_kwargs    more template variables (Qwen3's enable_thinking)

Anything wrong raises ValueError fit for the client, naming the field.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zserve.common.request_limits import LIMITS
from zserve.tokenizer_proc.chat_template import ChatTemplate

CHAT_KEYS = ("tools", "continue_final_message", "add_generation_prompt", "chat_template", "chat_template_kwargs")
MAX_TEMPLATE_CHARS = 64 << 10  # a request's own chat template: model templates run to ~10k characters
NUM_KEPT_TEMPLATES = 16


@dataclass(frozen=True, slots=True)
class ChatOptions:
    tools: list[dict] | None = None
    continue_final: bool = False
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] | None = None
    template: ChatTemplate | None = None  # the request's own; None: the model's

    @staticmethod
    def of(
        body: dict, check_tools: Callable[[Any], list[dict] | None], templates: RequestTemplates,
    ) -> ChatOptions:
        continue_final = _check_bool(body, "continue_final_message", False)
        add_generation_prompt = _check_bool(body, "add_generation_prompt", not continue_final)
        if continue_final and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true: the last "
                             "message is either continued or answered")
        source = body.get("chat_template")
        return ChatOptions(
            tools=check_tools(body.get("tools")), continue_final=continue_final,
            add_generation_prompt=add_generation_prompt, template_kwargs=_check_template_kwargs(
                body.get("chat_template_kwargs")),
            template=None if source is None else templates.get(source),
        )


class RequestTemplates:
    """Chat templates sent with requests, compiled once per source; the last NUM_KEPT_TEMPLATES are kept."""

    def __init__(self) -> None:
        self._compiled: OrderedDict[str, ChatTemplate] = OrderedDict()

    def get(self, source: Any) -> ChatTemplate:
        if not isinstance(source, str) or not source.strip():
            raise ValueError("chat_template must be a non-empty string (a Jinja chat template)")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ValueError(f"chat_template is more than {MAX_TEMPLATE_CHARS} characters")
        template = self._compiled.pop(source, None) or ChatTemplate(source, "the request's chat_template")
        self._compiled[source] = template
        while len(self._compiled) > NUM_KEPT_TEMPLATES:
            self._compiled.popitem(last=False)
        return template


def _check_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a boolean, got {type(value).__name__}")
    return value


def _check_template_kwargs(value: Any) -> dict[str, Any] | None:
    """`chat_template_kwargs`: an object of template variables, bounded like `tools` (the render
    itself refuses a name it sets: ChatTemplate.render)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"chat_template_kwargs must be an object of template variables, got {type(value).__name__}")
    if len(json.dumps(value)) > LIMITS.max_tools_json_chars:
        raise ValueError(f"chat_template_kwargs is more than {LIMITS.max_tools_json_chars} characters of JSON")
    return value
