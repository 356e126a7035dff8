"""Per-request generation options, as the client sends them and the scheduler keeps them.

Built from the client's untrusted fields once, at the door (`from_dict`, in the frontend's
RequestValidator), then carried whole to the scheduler as a nested wire message."""

from __future__ import annotations

import json
import math
from typing import Any

from msgspec import field
from msgspec.structs import asdict

from zserve.common.json_schema_check import check_json_schema
from zserve.common.request_limits import INT32_MAX, LIMITS
from zserve.common.wire import Message

# What the native API (the Python clients, the Engine, the chat shell, POST /generate) asks for when a
# request names no max_tokens: SGLang's native default (max_new_tokens=128), so a forgotten limit costs
# seconds, not a run to the context. The clients add it; the server never does, so the OpenAI routes,
# which send max_tokens=None, keep OpenAI's meaning of no max_tokens (up to the context).
DEFAULT_MAX_TOKENS = 128
MAX_GRAMMAR_AFTER_IDS = 16  # a `</think>` marker is one token, or a few where it is not a special token


class SamplingParams(Message, frozen=True):
    # None: up to the context (prompt + output fill it at most); clients default to DEFAULT_MAX_TOKENS
    max_tokens: int | None = None
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off; must be in (0, 1]
    min_p: float = 0.0  # 0 = off; must be in [0, 1)
    seed: int | None = None  # None: the scheduler draws one (sampling is still per-request reproducible in a run)
    stop: tuple[str, ...] = ()  # stop strings, matched on detokenized text
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logprob: bool = False
    presence_penalty: float = 0.0  # OpenAI: logit -= presence_penalty if the token is in the output
    frequency_penalty: float = 0.0  # OpenAI: logit -= frequency_penalty * its count in the output
    # transformers/vLLM: a token of the prompt or output has logit / p (> 0) or * p (< 0)
    repetition_penalty: float = 1.0
    # token id (as a string, JSON's key) -> added to its logit
    logit_bias: dict[str, float] = field(default_factory=dict)
    min_tokens: int = 0  # stop tokens (EOS, stop_token_ids) are banned until this many tokens are out
    top_logprobs: int = 0  # with return_logprob: also the most likely tokens at each position, this many (<= 20)
    # also each prompt token's logprob (the first has none) and this many most likely (<= 20)
    prompt_logprobs: int | None = None
    json_object: bool = False  # structured output: any JSON value (OpenAI's JSON mode)
    json_schema: str | None = None  # structured output: JSON matching this JSON schema (its text)
    regex: str | None = None  # structured output: text matching this regular expression
    ebnf: str | None = None  # structured output: text of this EBNF grammar (GBNF, as xgrammar reads it)
    # structured output starts once the output ends with these token ids (a reasoning model's `</think>`: the
    # thinking is free, the answer constrained, as vLLM does); () = from the first token
    grammar_after: tuple[int, ...] = ()
    return_prompt_text: bool = False  # also the prompt's text (the detokenizer's decoding), in the first output: echo
    # the output text leaves special tokens (EOS, chat markers) out (SGLang's, vLLM's default)
    skip_special_tokens: bool = True
    # the output text keeps the stop string that ended it (SGLang's name; vLLM's include_stop_str_in_output)
    no_stop_trim: bool = False
    # the LoRA adapter (its name in --lora-modules) that computes this request; None: the base model
    lora_path: str | None = None

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, spec) of the structured output asked for, or None."""
        if self.json_object:
            return "json_object", ""
        for kind in ("json_schema", "regex", "ebnf"):
            spec = getattr(self, kind)
            if spec is not None:
                return kind, spec
        return None

    @property
    def has_penalties(self) -> bool:
        """Whether the worker has to adjust this request's logits (penalties, bias, min_tokens)."""
        return (
            self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
            or bool(self.logit_bias) or self.min_tokens > 0
        )

    def validate(self) -> None:
        """Raise ValueError with a message fit for the client. Every number has a range and every
        list a cap (common/request_limits.py); the vocabulary and context bounds come on top, in
        the frontend's RequestValidator."""
        if self.max_tokens is not None and not _is_int_in(self.max_tokens, 1, LIMITS.max_max_tokens):
            raise ValueError(
                f"max_tokens must be an integer in [1, {LIMITS.max_max_tokens}] (or none: up to the context), "
                f"got {self.max_tokens!r}"
            )
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int_in(self.top_k, 0, LIMITS.max_top_k):
            raise ValueError(f"top_k must be an integer in [0, {LIMITS.max_top_k}] (0 = off), got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p!r}")
        if self.seed is not None and not _is_int_in(self.seed, 0, 2**63 - 1):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if len(self.stop) > LIMITS.max_stop_strings:
            raise ValueError(f"stop has {len(self.stop)} strings; at most {LIMITS.max_stop_strings} are allowed")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop[{i}] must be a non-empty string, got {_short(s)}")
            if len(s) > LIMITS.max_stop_string_chars:
                raise ValueError(
                    f"stop[{i}] is {len(s)} characters; at most {LIMITS.max_stop_string_chars} are allowed"
                )
        if len(self.stop_token_ids) > LIMITS.max_stop_token_ids:
            raise ValueError(
                f"stop_token_ids has {len(self.stop_token_ids)} ids; at most {LIMITS.max_stop_token_ids} are allowed"
            )
        for i, t in enumerate(self.stop_token_ids):
            if not _is_int_in(t, 0, INT32_MAX):
                raise ValueError(f"stop_token_ids[{i}] must be a token id (an integer >= 0), got {_short(t)}")
        if not isinstance(self.ignore_eos, bool) or not isinstance(self.return_logprob, bool):
            raise ValueError("ignore_eos and return_logprob must be booleans")
        for name in ("return_prompt_text", "skip_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {_short(getattr(self, name))}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -LIMITS.max_penalty <= value <= LIMITS.max_penalty:
                raise ValueError(
                    f"{name} must be in [-{LIMITS.max_penalty:g}, {LIMITS.max_penalty:g}], got {_short(value)}"
                )
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty <= LIMITS.max_repetition_penalty:
            raise ValueError(
                f"repetition_penalty must be in (0, {LIMITS.max_repetition_penalty:g}] (1 = off), "
                f"got {_short(self.repetition_penalty)}"
            )
        if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > LIMITS.max_logit_bias_entries:
            raise ValueError(f"logit_bias must map at most {LIMITS.max_logit_bias_entries} token ids to numbers")
        for token, bias in self.logit_bias.items():
            if not (isinstance(token, str) and token.isdigit() and len(token) <= 10):
                raise ValueError(f"logit_bias keys must be token ids, got {_short(token)}")
            if not _is_number(bias) or not -LIMITS.max_logit_bias <= bias <= LIMITS.max_logit_bias:
                raise ValueError(
                    f"logit_bias[{token}] must be in [-{LIMITS.max_logit_bias:g}, {LIMITS.max_logit_bias:g}], "
                    f"got {_short(bias)}"
                )
        if not isinstance(self.json_object, bool):
            raise ValueError("json_object must be a boolean")
        grammars = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None] + (
            ["json_object"] if self.json_object else []
        )
        if len(grammars) > 1:
            raise ValueError(f"give at most one of json_object, json_schema, regex, ebnf; got {', '.join(grammars)}")
        if grammars and self.ignore_eos:
            raise ValueError("ignore_eos cannot be used with structured output: the grammar ends the text with EOS")
        if grammars and _is_number(self.min_tokens) and self.min_tokens > 0:
            raise ValueError(
                "min_tokens cannot be used with structured output: the grammar decides where the text ends"
            )
        if self.grammar_after and not grammars:
            raise ValueError("grammar_after needs structured output (json_object, json_schema, regex or ebnf)")
        if len(self.grammar_after) > MAX_GRAMMAR_AFTER_IDS or not all(
            _is_int_in(t, 0, INT32_MAX) for t in self.grammar_after
        ):
            raise ValueError(f"grammar_after must be at most {MAX_GRAMMAR_AFTER_IDS} token ids (integers >= 0)")
        for kind in ("json_schema", "regex", "ebnf"):
            spec = getattr(self, kind)
            if spec is not None and (not isinstance(spec, str) or not spec or len(spec) > LIMITS.max_grammar_chars):
                raise ValueError(f"{kind} must be a non-empty string of at most {LIMITS.max_grammar_chars} characters")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except RecursionError:
                raise ValueError(f"json_schema nests deeper than {LIMITS.max_schema_depth} levels") from None
            except ValueError as exc:
                raise ValueError(f"json_schema is not JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("json_schema must be a JSON schema (an object)")
            check_json_schema(schema)
        if self.prompt_logprobs is not None and not _is_int_in(self.prompt_logprobs, 0, LIMITS.max_top_logprobs):
            raise ValueError(
                f"prompt_logprobs must be an integer in [0, {LIMITS.max_top_logprobs}], "
                f"got {_short(self.prompt_logprobs)}"
            )
        if not _is_int_in(self.top_logprobs, 0, LIMITS.max_top_logprobs):
            raise ValueError(
                f"top_logprobs must be an integer in [0, {LIMITS.max_top_logprobs}], got {_short(self.top_logprobs)}"
            )
        if self.lora_path is not None and (not isinstance(self.lora_path, str) or len(self.lora_path) > 1024):
            raise ValueError(f"lora_path must be an adapter's name (a string), got {_short(self.lora_path)}")
        if not _is_int_in(self.min_tokens, 0, LIMITS.max_max_tokens):
            raise ValueError(f"min_tokens must be an integer >= 0, got {_short(self.min_tokens)}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["grammar_after"] = list(self.grammar_after)
        d["logit_bias"] = dict(self.logit_bias)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SamplingParams:
        """Build from client-supplied fields; unknown fields and wrong types raise ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"sampling params must be a mapping, got {type(d).__name__}")
        unknown = set(d) - set(SamplingParams.__struct_fields__)
        if unknown:
            raise ValueError(f"unknown sampling field(s): {_names(unknown)}")
        kw = dict(d)
        for key in ("stop", "stop_token_ids", "grammar_after"):
            if key in kw:
                v = kw[key]
                if isinstance(v, str) and key == "stop":
                    v = [v]
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"{key} must be a list, got {type(v).__name__}")
                kw[key] = tuple(v)
        for key in ("temperature", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if _is_number(kw.get(key)):
                kw[key] = float(kw[key])
        # keys are strings on the wire (the Python client turns int ids into them)
        if isinstance(kw.get("logit_bias"), dict):
            kw["logit_bias"] = {k: float(v) if _is_number(v) else v for k, v in kw["logit_bias"].items()}
        if isinstance(kw.get("json_schema"), (dict, bool)):  # the Python client may pass the schema itself
            kw["json_schema"] = json.dumps(kw["json_schema"])
        if _is_int_in(kw.get("top_logprobs"), 1, LIMITS.max_top_logprobs):
            kw["return_logprob"] = True  # top logprobs come with the chosen token's
        params = SamplingParams(**kw)
        params.validate()
        return params


def _is_number(x: Any) -> bool:
    """A finite float, or an int a float can hold (a huge int would overflow float())."""
    if isinstance(x, float):
        return math.isfinite(x)
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) <= 2**53


def _is_int_in(x: Any, low: int, high: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _names(keys: set) -> str:
    """Up to 5 of a client's unknown field names, for an error message."""
    names = sorted(repr(k) if not isinstance(k, str) else k[:64] for k in list(keys)[:100])
    return ", ".join(names[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _short(x: Any) -> str:
    """A value for an error message, cut short (a client's value may be huge)."""
    text = repr(x)
    return text if len(text) <= 64 else text[:60] + "...'"
