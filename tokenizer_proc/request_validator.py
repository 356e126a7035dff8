"""The tokenizer process's edge: a client's request body in, prompt ids and sampling params out.

A body (decoded from msgpack, so only plain values, and untrusted) has exactly one of
  prompt: str | input_ids: list[int] | messages: list[{role, content}]
plus an optional `sampling` dict of SamplingParams fields (and, with messages, how they are
rendered: `tools`, `continue_final_message`, `add_generation_prompt`, `chat_template`,
`chat_template_kwargs`; tokenizer_proc/chat_options.py).
Anything wrong raises ValueError with a message fit to send back to the client as the request's
error; nothing is dropped silently.

prompt + max_tokens must fit the context (the model's, or less with --context-length): a request
that asks for more is refused at once, naming both numbers, as vLLM does. Without max_tokens it
may generate up to the context (the scheduler reads None so). A prompt must leave room for at
least one output token.

Every bound (common/request_limits.py) is checked before the expensive step it protects: text
length before encoding, the message count before rendering, the rendered size and time while
rendering (ChatTemplate), top_k and stop ids against the vocabulary.
"""

from __future__ import annotations

import json
from typing import Any

from zserve.common.choices import bad_n_error, num_choices
from zserve.common.context_limit import over_context_error
from zserve.common.lora_modules import unknown_adapter_error
from zserve.common.request_limits import LIMITS
from zserve.common.sampling_params import SamplingParams
from zserve.tokenizer_proc.chat_options import CHAT_KEYS, ChatOptions, RequestTemplates
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

PROMPT_KEYS = ("prompt", "input_ids", "messages")
BODY_KEYS = frozenset((*PROMPT_KEYS, "sampling", "n", *CHAT_KEYS, "embed"))
EMBED_KEYS = frozenset(("prompt", "input_ids", "embed"))  # an embedding request: a prompt, nothing to sample
MESSAGE_KEYS = frozenset(("role", "content", "name", "tool_calls", "tool_call_id"))
ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))


class RequestValidator:
    def __init__(
        self, tokenizer: TextTokenizer, context_len: int, vocab_size: int | None = None,
        default_sampling: dict[str, float] | None = None, is_embedding: bool = False,
        lora_names: tuple[str, ...] = (),
    ):
        """`context_len`: tokens the model attends over (prompt + output). `vocab_size`: ids the
        model accepts, if smaller than the tokenizer's (default: the tokenizer's).
        `default_sampling`: what a request that leaves a sampling field out gets (the model's
        generation_config.json; empty: SamplingParams' own defaults, greedy). `is_embedding`: the
        server runs --task embed, and takes embedding requests (`embed: true`) only. `lora_names`: the
        LoRA adapters a request may name in lora_path (--lora-modules; empty: none)."""
        self.is_embedding = is_embedding
        self.lora_names = lora_names
        self.default_sampling = dict(default_sampling or {})
        if context_len < 2:
            raise ValueError(f"context_len must be >= 2, got {context_len}")
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.vocab_size = min(vocab_size or tokenizer.vocab_size, tokenizer.vocab_size)
        # A token covers at most max_token_len characters, so text longer than this cannot fit in
        # the context; rejecting it before encoding keeps a huge body from stalling the process.
        self.max_prompt_chars = 2 * context_len * tokenizer.max_token_len + 64
        self.request_templates = RequestTemplates()  # requests' own chat templates, compiled once

    def num_copies(self, body: dict) -> int:
        """`n`: how many choices of the prompt the request wants (1 when it does not say)."""
        n = num_choices(body)
        if n is None:
            raise ValueError(bad_n_error(body))
        return n

    def validate(self, body: Any) -> tuple[list[int], SamplingParams]:
        if not isinstance(body, dict):
            raise ValueError(f"request must be a mapping, got {type(body).__name__}")
        unknown = [k for k in body if k not in BODY_KEYS]
        if unknown:
            names = ", ".join(_name(k) for k in unknown[:5]) + (
                f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            )
            raise ValueError(
                f"unknown request field(s): {names}; a request has one of "
                "prompt, input_ids, messages, and optionally sampling and n"
            )
        given = [k for k in PROMPT_KEYS if body.get(k) is not None]
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise ValueError(f"a request needs exactly one of prompt, input_ids, messages; got {what}")
        if self._is_embed_request(body):
            kind = given[0]
            input_ids = self.encode_prompt(body["prompt"]) if kind == "prompt" else self.check_ids(body["input_ids"])
            if not input_ids or len(input_ids) >= self.context_len:
                raise ValueError(f"the input is {len(input_ids)} tokens; this server embeds 1 to "
                                 f"{self.context_len - 1} (its context is {self.context_len})")
            return input_ids, SamplingParams(max_tokens=1)  # prefill only: the scheduler samples nothing

        sampling = body.get("sampling")
        if sampling is None:
            sampling = {}
        if isinstance(sampling, dict) and self.default_sampling:
            sampling = {**self.default_sampling, **sampling}
        params = SamplingParams.from_dict(sampling)
        if params.lora_path and params.lora_path not in self.lora_names:
            raise ValueError(unknown_adapter_error(params.lora_path, self.lora_names))
        bad_stop_ids = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad_stop_ids:
            raise ValueError(f"stop_token_ids {bad_stop_ids[:5]} are not in the vocabulary (size {self.vocab_size})")
        bad_bias_ids = [t for t in params.logit_bias if int(t) >= self.vocab_size]
        if bad_bias_ids:
            raise ValueError(
                f"logit_bias token ids {bad_bias_ids[:5]} are not in the vocabulary (size {self.vocab_size})"
            )
        if params.top_k > self.vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size ({self.vocab_size}), got {params.top_k}")

        kind = given[0]
        if kind != "messages" and body.get("continue_final_message"):
            raise ValueError("continue_final_message continues a chat's last message: it needs messages, not a prompt")
        for name in ("chat_template_kwargs", "chat_template", "add_generation_prompt"):
            if kind != "messages" and body.get(name) is not None:
                raise ValueError(f"{name} says how messages are rendered: it needs messages, not a prompt")
        if kind == "prompt":
            input_ids = self.encode_prompt(body["prompt"])
        elif kind == "input_ids":
            input_ids = self.check_ids(body["input_ids"])
        else:
            input_ids = self.encode_messages(body["messages"], self.chat_options(body))

        if not input_ids:
            raise ValueError("the prompt is empty after tokenization")
        if len(input_ids) >= self.context_len:
            raise ValueError(
                f"the prompt is {len(input_ids)} tokens, but the model's context is {self.context_len} "
                f"tokens; a prompt may have at most {self.context_len - 1} to leave room for output"
            )
        if params.max_tokens is not None and len(input_ids) + params.max_tokens > self.context_len:
            prompt_word = "messages" if kind == "messages" else "prompt"
            raise ValueError(over_context_error(self.context_len, len(input_ids), params.max_tokens, prompt_word))
        return input_ids, params

    def _is_embed_request(self, body: dict) -> bool:
        """Whether `body` asks for an embedding (`embed: true`), which only a --task embed server
        answers, and which carries a prompt or input_ids and nothing else."""
        embed = body.get("embed", False)
        if not isinstance(embed, bool):
            raise ValueError(f"embed must be a boolean, got {type(embed).__name__}")
        if embed != self.is_embedding:
            raise ValueError(
                "this server runs --task embed: it answers embedding requests (/v1/embeddings) only, not generation"
                if self.is_embedding else
                "this server generates text; embeddings need a server started with --task embed"
            )
        extra = [k for k in body if k not in EMBED_KEYS and body[k] is not None and body[k] != {}]
        if embed and extra:
            raise ValueError(f"an embedding request takes a prompt or input_ids only, not {', '.join(extra)}")
        return embed

    def encode_prompt(self, prompt: Any, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("prompt is empty")
        self._check_text_len(len(prompt))
        return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)

    def check_ids(self, ids: Any) -> list[int]:
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"input_ids must be a list of integers, got {type(ids).__name__}")
        if not ids:
            raise ValueError("input_ids is empty")
        if len(ids) >= self.context_len:
            raise ValueError(
                f"the prompt is {len(ids)} tokens, but the model's context is {self.context_len} tokens; "
                f"a prompt may have at most {self.context_len - 1} to leave room for output"
            )
        for i, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool):
                raise ValueError(f"input_ids[{i}] must be an integer, got {type(t).__name__}")
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"input_ids[{i}] = {t} is not a token id (vocabulary size {self.vocab_size})")
        return list(ids)

    def check_tools(self, tools: Any) -> list[dict] | None:
        """`tools`: function definitions for the chat template ({"type": "function", "function": {...}})."""
        if tools is None:
            return None
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools) or len(tools) > LIMITS.max_tools:
            raise ValueError(f"tools must be a list of at most {LIMITS.max_tools} function definitions (objects)")
        if len(json.dumps(tools)) > LIMITS.max_tools_json_chars:
            raise ValueError(f"tools is more than {LIMITS.max_tools_json_chars} characters of JSON")
        return tools

    def chat_options(self, body: dict) -> ChatOptions:
        """How the body's messages are rendered (ValueError naming a bad field)."""
        return ChatOptions.of(body, self.check_tools, self.request_templates)

    def encode_messages(self, messages: Any, options: ChatOptions | None = None) -> list[int]:
        options = options or ChatOptions()
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        max_messages = min(LIMITS.max_messages, self.context_len - 1)
        if len(messages) > max_messages:
            raise ValueError(
                f"messages has {len(messages)} entries; at most {max_messages} fit this server "
                f"(each costs the chat template at least one of the context's {self.context_len} tokens)"
            )
        num_chars = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ValueError(f"messages[{i}] must be an object with role and content, got {type(m).__name__}")
            extra = [k for k in m if k not in MESSAGE_KEYS]
            if extra:
                raise ValueError(f"messages[{i}] has unknown field(s): {', '.join(_name(k) for k in extra[:5])}")
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or role not in ROLES:
                raise ValueError(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {_name(role)}")
            if m.get("tool_calls") is not None:
                num_chars += _check_tool_calls(m, i)
                content = content or ""
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
            if "tool_call_id" in m and (
                not isinstance(m["tool_call_id"], str) or len(m["tool_call_id"]) > LIMITS.max_message_name_chars
            ):
                raise ValueError(
                    f"messages[{i}].tool_call_id must be a string of at most "
                    f"{LIMITS.max_message_name_chars} characters"
                )
            if "name" in m and (not isinstance(m["name"], str) or len(m["name"]) > LIMITS.max_message_name_chars):
                raise ValueError(
                    f"messages[{i}].name must be a string of at most {LIMITS.max_message_name_chars} characters"
                )
            num_chars += len(content)
        self._check_text_len(num_chars)
        if options.continue_final and messages[-1].get("role") != "assistant":
            raise ValueError(f"continue_final_message continues the last message, which must be the assistant's; "
                             f"messages[{len(messages) - 1}] is the {_name(messages[-1].get('role'))}'s")
        return self.tokenizer.encode_chat(
            list(messages), add_generation_prompt=options.add_generation_prompt, max_chars=self.max_prompt_chars,
            timeout_s=LIMITS.render_timeout_s, tools=options.tools, continue_final_message=options.continue_final,
            template_kwargs=options.template_kwargs, template=options.template,
        )

    def _check_text_len(self, num_chars: int) -> None:
        if num_chars > self.max_prompt_chars:
            raise ValueError(
                f"the prompt is {num_chars} characters, too long to fit the model's context of "
                f"{self.context_len} tokens"
            )


def _name(value: Any) -> str:
    """A client's key or value in an error message, cut short."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:64] + "...") if len(text) > 64 else repr(text) if isinstance(value, str) else text


def _check_tool_calls(message: dict, idx: int) -> int:
    """An assistant message's earlier tool calls ([{"id", "type": "function", "function": {"name",
    "arguments"}}]); arguments given as a JSON string become an object, as templates expect.
    Returns their size in characters."""
    calls = message["tool_calls"]
    if message.get("role") != "assistant" or not isinstance(calls, list) or len(calls) > LIMITS.max_tools:
        raise ValueError(f"messages[{idx}].tool_calls must be a list of calls on an assistant message")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"messages[{idx}].tool_calls[{j}] must be {{type: function, function: {{name, arguments}}}}"
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise ValueError(f"messages[{idx}].tool_calls[{j}].function.arguments is not JSON") from None
    return len(json.dumps(calls))
