"""UnknownFieldPolicy: what becomes of a request field the OpenAI request models do not declare.

By default, vLLM's way: the field is ignored, and logged once per field name for the life of the
process. Newer SDKs and agent frameworks send fields this server does not know yet; refusing them
would break those clients, and one log line per name says what was dropped without flooding the
log. With --strict-requests such a field is a 400 naming it instead. Either way the fields the
models do declare are validated as strictly as before (a wrong type is still a 400).

The request models keep undeclared fields aside (pydantic `extra="allow"`, in `model_extra`);
this walks the parsed body, nested models in lists included, to find them.

SGLang's own request fields that change nothing here (SGLANG_IGNORED_FIELDS: sglang-router 0.3.2
adds several to every request it forwards, e.g. `return_hidden_states`, `log_metrics`) are not
unknown: they are accepted, also under --strict-requests, and noted once
per name at INFO, so a router's traffic does not fill the log with warnings.
"""

from __future__ import annotations

import functools
import logging
import typing
from dataclasses import dataclass, field

from pydantic import BaseModel

from zserve.http_proc.shared.api_error import ApiError

logger = logging.getLogger("http_proc")
MAX_WARNED_NAMES = 256  # distinct names logged at most: a client inventing names cannot grow the set or flood the log

FieldPath = tuple[str | int, ...]  # ("tools", 0, "function") is tools[0].function

# Named as `field_name` joins a path: "sampling_params.x" is x inside /generate's sampling_params.
SGLANG_IGNORED_FIELDS = frozenset((
    # /v1/chat/completions and /v1/completions (sglang-router 0.3.2 sends return_hidden_states on every chat
    # request, and separate_reasoning, stream_reasoning and chat_template_kwargs, which the chat route honours)
    "return_hidden_states", "lora_path",
    "session_params", "rid", "bootstrap_host", "bootstrap_port", "bootstrap_room", "data_parallel_rank",
    "custom_logit_processor", "custom_params", "priority",
    # /generate, SGLang's shape (sglang-router 0.3.2 sends model, log_metrics ... return_entropy on every request)
    "model", "return_text_in_logprobs", "log_metrics", "background", "no_logs", "return_bytes", "return_entropy",
    "logprob_start_len", "token_ids_logprob", "stream_interval",
    "sampling_params.spaces_between_special_tokens", "sampling_params.stream_interval",
    "sampling_params.custom_params",
))


def field_path(loc: FieldPath) -> str:
    """A field's location as OpenAI's errors write it: `messages[0].content`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def unknown_field_paths(model: BaseModel) -> list[FieldPath]:
    """Where `model` (and every model nested in it, directly or in lists) holds undeclared fields."""
    paths: list[FieldPath] = []
    _collect(model, (), paths)
    return paths


def _collect(value: object, loc: FieldPath, paths: list[FieldPath]) -> None:
    # only the fields whose type can hold a model are visited: 100,000 messages take milliseconds
    if isinstance(value, BaseModel):
        if value.model_extra:
            paths += [(*loc, name) for name in value.model_extra]
        for name in _model_holding_fields(type(value)):
            _collect(getattr(value, name), (*loc, name), paths)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _collect(item, (*loc, i), paths)


@functools.cache
def _model_holding_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    return tuple(name for name, info in cls.model_fields.items() if _holds_model(info.annotation))


def _holds_model(annotation: object) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(arg) for arg in typing.get_args(annotation))


def field_name(path: FieldPath) -> str:
    """One name for a field wherever it is: messages[3].x and messages[0].x are both messages.x."""
    return ".".join(str(part)[:64] for part in path if isinstance(part, str))


@dataclass
class UnknownFieldPolicy:
    """Owned by the HTTP process (one per process): `warned` is the names already logged."""

    strict: bool = False  # --strict-requests: refuse unknown fields with a 400
    warned: set[str] = field(default_factory=set)
    noted: set[str] = field(default_factory=set)  # SGLang field names already noted at INFO (a fixed set: bounded)

    def check(self, body: BaseModel, route: str) -> None:
        """Raise the 400 (strict), or log each unknown field name the first time it is seen."""
        self.check_paths(unknown_field_paths(body), route)

    def check_paths(self, paths: list[FieldPath], route: str) -> None:
        if not paths:
            return
        paths = [p for p in paths if not self._is_sglang_field(p, route)]
        if not paths:
            return
        if self.strict:
            parts = [f"{field_path(p)}: Extra inputs are not permitted" for p in paths[:5]]
            if len(paths) > 5:
                parts.append(f"and {len(paths) - 5} more")
            raise ApiError(400, "invalid request: " + "; ".join(parts) + " (this server runs with --strict-requests)",
                           param=field_path(paths[0]))
        for path in paths:
            name = field_name(path)
            if name in self.warned or len(self.warned) >= MAX_WARNED_NAMES:
                continue
            self.warned.add(name)
            logger.warning("ignoring unknown request field %r in %s (sent by a newer client?); "
                           "--strict-requests refuses such requests", name, route)

    def _is_sglang_field(self, path: FieldPath, route: str) -> bool:
        """Whether `path` is one of SGLang's fields that change nothing here (noted the first time)."""
        name = field_name(path)
        if name not in SGLANG_IGNORED_FIELDS:
            return False
        if name not in self.noted:
            self.noted.add(name)
            logger.info("accepting SGLang request field %r in %s; it has no effect in zserve (noted once)", name, route)
        return True
