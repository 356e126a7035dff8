"""The request bodies of POST /v1/completions and /v1/chat/completions (pydantic).

Undeclared fields are kept aside, not refused here (shared/request_body.py): UnknownFieldPolicy
(shared/unknown_fields.py) ignores and logs them, or refuses them under --strict-requests.

Each request becomes a list of `SubRequest`s, one per returned choice: `n` copies of each prompt, all
with the request's sampling (its seed too): the group sends each prompt once with `n`, and the
scheduler alone seeds copy i with seed + i (scheduler_proc/req_intake.py). Sampling
values are checked by the server's own validator (their errors come back as 400s); this module
checks only the OpenAI shape and refuses, with a 400 that says so, the options zserve cannot honour.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cached_property
from typing import Any, Literal

from pydantic import Field

from zserve.http_proc.apis.openai.structured_output import StructuredOutput
from zserve.http_proc.apis.openai.tool_choice import ForcedToolChoice
from zserve.http_proc.reasoning import ReasoningOptions, ReasoningParser
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.refused_fields import VLLM_UNHONOURED
from zserve.http_proc.shared.request_body import RequestModel
from zserve.http_proc.shared.request_group import SubRequest
from zserve.http_proc.tools.parser import ToolCallParser

STRUCTURED_OUTPUT_FIELDS = (
    "regex", "ebnf", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
)
MAX_CHOICES = 128  # n x prompts: each is one request in the server's queue


def with_tool_markup(subs: list[SubRequest], parser: ToolCallParser | ForcedToolChoice | None) -> list[SubRequest]:
    """`subs` decoded with special tokens kept where the tool-call format's markers are special tokens (as vLLM's
    mistral parser asks: `[TOOL_CALLS]`, `[ARGS]`); unchanged otherwise."""
    if not isinstance(parser, ToolCallParser) or not parser.needs_special_tokens:
        return subs
    return [replace(s, sampling={**s.sampling, "skip_special_tokens": False}) for s in subs]


class StreamOptions(RequestModel):
    include_usage: bool = False


class SamplingRequest(RequestModel):
    """Fields both endpoints share. top_k, min_p, stop_token_ids, ignore_eos, repetition_penalty
    and min_tokens are extras, as vLLM and SGLang take them (the OpenAI SDK sends them with
    `extra_body=`). A sampling field left out takes the server's
    default, the same on every entry point (the model's generation_config.json, else greedy)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    top_logprobs: int | None = None
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}
    response_format: dict[str, Any] | None = None
    regex: str | None = None  # structured output extras, as SGLang names them
    ebnf: str | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's: {json | regex | choice | grammar | json_object}
    guided_json: dict[str, Any] | str | None = None  # vLLM's older spellings
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    skip_special_tokens: bool = True  # SGLang's and vLLM's extras (sglang-router sends both on every request)
    no_stop_trim: bool = False  # the text keeps the stop string that ended it
    include_stop_str_in_output: bool = False  # vLLM's spelling of no_stop_trim
    bad_words: list[str] | None = None  # vLLM's, refused when set (VLLM_UNHONOURED)
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
        for name, why in VLLM_UNHONOURED.items():
            if getattr(self, name) not in (None, []):
                raise ApiError(400, f"{name} is not supported by this server: {why}", param=name)

    def sampling(self, max_tokens: int | None) -> dict[str, Any]:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        values = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "stop": stop or None,
            "stop_token_ids": self.stop_token_ids or None,
            "ignore_eos": self.ignore_eos or None,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "logit_bias": self.logit_bias or None,
            "min_tokens": self.min_tokens,
            "skip_special_tokens": None if self.skip_special_tokens else False,  # sent only when not the default
            "no_stop_trim": self.no_stop_trim or self.include_stop_str_in_output or None,
            **self.logprob_fields(),
            **self.grammar_fields(),
        }
        return {k: v for k, v in values.items() if v is not None}

    def logprob_fields(self) -> dict[str, Any]:
        """The sampling fields that ask the server for logprobs (each endpoint spells them its way)."""
        return {}

    def grammar_fields(self) -> dict[str, Any]:
        """Structured output in any of its spellings (http_proc/apis/openai/structured_output.py)."""
        fields = {name: getattr(self, name) for name in STRUCTURED_OUTPUT_FIELDS}
        fields["response_format"] = self._response_format_grammar()
        return StructuredOutput.of(fields).sampling_fields()

    def _response_format_grammar(self) -> tuple[str, Any] | None:
        """OpenAI's `response_format` as (kind, value), None for text."""
        kind = (self.response_format or {}).get("type", "text")
        if kind == "json_object":
            return "json_object", True
        if kind == "json_schema":
            spec = self.response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
                raise ApiError(
                    400, "response_format json_schema needs json_schema.schema (a JSON schema)",
                    param="response_format",
                )
            return "json", spec["schema"]
        if kind != "text":
            raise ApiError(
                400, f"response_format type must be text, json_object or json_schema, got {kind!r}",
                param="response_format",
            )
        return None

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprob_fields())

    def expand(self, prompts: list[dict[str, Any]], max_tokens: int | None) -> list[SubRequest]:
        if len(prompts) * self.n > MAX_CHOICES:
            raise ApiError(
                400, f"n x prompts is {len(prompts) * self.n}; at most {MAX_CHOICES} choices per request", param="n",
            )
        return [
            SubRequest(p_idx * self.n + i, p_idx, prompt, self.sampling(max_tokens))
            for p_idx, prompt in enumerate(prompts)
            for i in range(self.n)
        ]


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def logprob_fields(self) -> dict[str, Any]:
        """Completions: `logprobs: k` is the chosen token's logprob and the k most likely; with
        `echo`, the prompt tokens' too (prompt_logprobs)."""
        if self.logprobs is None:
            return {}
        return {
            "return_logprob": True, "top_logprobs": self.logprobs or None,
            "prompt_logprobs": self.logprobs if self.echo else None,
        }

    def sub_requests(self) -> list[SubRequest]:
        self.check_supported()
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ApiError(400, f"logprobs must be in [0, 20], got {self.logprobs}", param="logprobs")
        if self.suffix:
            raise ApiError(400, "suffix is not supported by this server", param="suffix")
        if self.top_logprobs is not None:
            raise ApiError(400, "top_logprobs is the chat route's: on completions give logprobs: k (the top count)",
                           param="top_logprobs")
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, "best_of is not supported by this server (only best_of == n)", param="best_of")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(
                400, "max_tokens must be at least 1 (0 only with echo: the prompt scored, nothing generated)",
                param="max_tokens",
            )
        if self.scores_prompt_only and self.min_tokens:
            raise ApiError(400, f"min_tokens ({self.min_tokens}) must be at most max_tokens (0)", param="min_tokens")
        # echo with max_tokens 0 (lm-eval-harness' loglikelihood): one token is generated and not shown
        return self.expand(self._prompts(), 1 if self.scores_prompt_only else self.max_tokens)

    @property
    def scores_prompt_only(self) -> bool:
        """`echo` with `max_tokens: 0`: the answer is the prompt (and its logprobs), nothing generated."""
        return self.echo and self.max_tokens == 0

    def _prompts(self) -> list[dict[str, Any]]:
        p = self.prompt
        if isinstance(p, str):
            return [{"prompt": p}]
        if not p:
            raise ApiError(400, "prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [{"input_ids": list(p)}]
        if all(isinstance(x, str) for x in p):
            return [{"prompt": x} for x in p]
        return [{"input_ids": list(x)} for x in p]


class ContentPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(RequestModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool's answer names the call

    def to_dict(self, idx: int) -> dict[str, Any]:
        if self.content is None and not self.tool_calls:
            raise ApiError(400, f"messages[{idx}].content is missing", param="messages")
        if self.content is None:
            text = None
        else:
            text = self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)
        out = {"role": self.role, "content": text}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDefinition(RequestModel):
    """A function tool, as OpenAI's API requires it: a name, and parameters a JSON schema (an object)."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition

    def to_dict(self) -> dict[str, Any]:
        """The tool as the chat template sees it: the declared fields given, nothing else."""
        function = {name: getattr(self.function, name) for name in FunctionDefinition.model_fields}
        return {"type": self.type, "function": {k: v for k, v in function.items() if v is not None}}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call in the answer
    # the last (assistant) message is continued, its turn left open (vLLM's, SGLang's)
    continue_final_message: bool = False
    add_generation_prompt: bool = True  # vLLM's: false renders the messages without opening the assistant's turn
    chat_template: str | None = None  # vLLM's: a Jinja chat template of the request's own
    chat_template_kwargs: dict[str, Any] | None = None  # more chat template variables (Qwen3's enable_thinking)
    # with --reasoning-parser (SGLang's): false keeps the thinking in content; stream_reasoning false sends
    # the thinking in one delta once it ends
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    def sub_requests(self) -> list[SubRequest]:
        """Without max_tokens (or max_completion_tokens) a chat may generate until the context is
        full, as in OpenAI's API: the request goes without one, and the server reads that so."""
        self.check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise ApiError(400, f"top_logprobs must be in [0, 20], got {self.top_logprobs}", param="top_logprobs")
        if (
            self.max_tokens is not None and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise ApiError(400, "max_tokens and max_completion_tokens differ; give one", param="max_completion_tokens")
        given = [v for v in (self.max_completion_tokens, self.max_tokens) if v is not None]
        max_tokens = given[0] if given else None
        messages = [m.to_dict(i) for i, m in enumerate(self.messages)]
        prompt = {"messages": messages, **({"tools": self.tool_dicts} if self.tools else {})}
        if self.continue_final_message:
            prompt["continue_final_message"] = True
        if not self.add_generation_prompt:
            prompt["add_generation_prompt"] = False
        if self.chat_template is not None:
            prompt["chat_template"] = self.chat_template
        if self.chat_template_kwargs:
            prompt["chat_template_kwargs"] = self.chat_template_kwargs
        return self.expand([prompt], max_tokens)

    @cached_property
    def tool_dicts(self) -> list[dict[str, Any]]:
        return [tool.to_dict() for tool in self.tools or []]

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the answer's tool calls become `tool_calls` (tools given, tool_choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def parallel(self) -> bool:
        """Whether the answer may hold several calls (OpenAI's default; parallel_tool_calls false: one)."""
        return self.parallel_tool_calls is not False

    @cached_property
    def forced_tool_choice(self) -> ForcedToolChoice | None:
        """tool_choice required or a named function: the grammar that makes the answer a call."""
        return ForcedToolChoice.of(self.tool_dicts, self.tool_choice, parallel=self.parallel)

    def tool_parser(self, template_parser: ToolCallParser | None) -> ToolCallParser | ForcedToolChoice | None:
        """What turns the answer's calls into `tool_calls`: the forced choice's grammar, else the
        chat template's format (`template_parser`, None when zserve does not know it), kept to
        the first call under parallel_tool_calls false; None when the request parses no calls."""
        if not self.parses_tool_calls:
            return None
        if self.forced_tool_choice is not None:
            return self.forced_tool_choice
        if template_parser is None:
            return None
        parser = template_parser.with_tools(self.tool_dicts)
        return parser if self.parallel else parser.single_call()

    def reasoning(self, parser: ReasoningParser | None) -> ReasoningOptions | None:
        """How the answer's thinking is split (the server's --reasoning-parser; None without one, or
        with separate_reasoning false). A forced tool call is read from the answer after the thinking,
        so with the thinking on it needs the thinking split off: separate_reasoning false is a 400."""
        if parser is None:
            return None
        if not self.separate_reasoning and self.forced_tool_choice and parser.thinks(self.chat_template_kwargs):
            raise ApiError(
                400, "separate_reasoning false cannot be combined with tool_choice required or a named function "
                "while the model thinks: the call is read from the answer after the thinking",
                param="separate_reasoning",
            )
        if not self.separate_reasoning:
            return None
        return ReasoningOptions(parser, self.chat_template_kwargs, self.stream_reasoning)

    def thinking_first(self, subs: list[SubRequest], parser: ReasoningParser | None) -> list[SubRequest]:
        """`subs` whose grammar (response_format, regex, ebnf, tool_choice required or named) starts
        after the thinking, as vLLM's: with the thinking on, the grammar waits for the parser's
        `</think>` ids (SamplingParams.grammar_after), so the thinking is free and the answer constrained."""
        if parser is None or not parser.end_ids or not parser.thinks(self.chat_template_kwargs):
            return subs
        if not self.grammar_fields():
            return subs
        return [replace(s, sampling={**s.sampling, "grammar_after": list(parser.end_ids)}) for s in subs]

    def grammar_fields(self) -> dict[str, Any]:
        forced = self.forced_tool_choice
        if forced is None:
            return super().grammar_fields()
        if super().grammar_fields():
            raise ApiError(
                400, "tool_choice required or a named function cannot be combined with structured output",
                param="tool_choice",
            )
        return {"json_schema": json.dumps(forced.schema)}

    def logprob_fields(self) -> dict[str, Any]:
        """Chat: `logprobs: true`, and `top_logprobs: k` for the k most likely."""
        if not self.logprobs:
            return {}
        return {"return_logprob": True, "top_logprobs": self.top_logprobs or None}
