"""StructuredOutput: the one grammar a request asks for, from whichever spelling it used.

    OpenAI    response_format: {"type": "json_object" | "json_schema", "json_schema": {"schema": ...}}
    SGLang    regex, ebnf (extras of the OpenAI routes; json_schema, regex, ebnf in /generate's sampling_params)
    vLLM      structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
    vLLM old  guided_json, guided_regex, guided_choice, guided_grammar

Every spelling becomes the sampling fields the scheduler's xgrammar source compiles (json_object, json_schema,
regex, ebnf): vLLM's `json` (a schema, or its JSON text) is json_schema, `grammar` (GBNF) is ebnf, and `choice`
(a list of strings) an EBNF of its alternatives, as vLLM builds it. A request that gives two spellings (or two
keys of structured_outputs) is a 400 naming both: which one wins would be a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from zserve.http_proc.shared.api_error import ApiError

# structured_outputs' keys that pick a grammar, and vLLM's keys that tune one (refused unless unset: not honoured)
GRAMMAR_KEYS = ("json", "regex", "choice", "grammar", "json_object")
TUNING_KEYS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
               "structural_tag")


@dataclass(frozen=True)
class StructuredOutput:
    """The spellings a request gave, by the name the client used (`guided_regex`, `structured_outputs.json`)."""

    given: dict[str, tuple[str, Any]]  # client's name -> (vLLM's kind: json | regex | choice | grammar, value)

    @classmethod
    def of(cls, request: dict[str, Any]) -> StructuredOutput:
        """`request`: the request's structured-output fields by name (response_format already as a kind)."""
        given: dict[str, tuple[str, Any]] = {}
        for name in ("json", "regex", "choice", "grammar"):
            if request.get(f"guided_{name}") is not None:
                given[f"guided_{name}"] = (name, request[f"guided_{name}"])
        for name, kind in (("regex", "regex"), ("ebnf", "grammar")):
            if request.get(name) is not None:
                given[name] = (kind, request[name])
        if request.get("response_format") is not None:
            given["response_format"] = request["response_format"]
        given.update(_structured_outputs(request.get("structured_outputs")))
        if len(given) > 1:
            names = list(given)
            raise ApiError(400, f"give one structured-output field; got {', '.join(names[:-1])} and {names[-1]}",
                           param=names[-1])
        return cls(given)

    def sampling_fields(self) -> dict[str, Any]:
        """The scheduler's grammar fields (empty when no grammar was asked for)."""
        if not self.given:
            return {}
        [(name, (kind, value))] = self.given.items()
        if kind == "json_object":
            return {"json_object": True}
        if kind == "json":
            return {"json_schema": value if isinstance(value, str) else json.dumps(value)}
        if kind == "regex":
            return {"regex": value}
        if kind == "grammar":
            return {"ebnf": value}
        if not value or not all(isinstance(c, str) and c for c in value):
            raise ApiError(400, f"{name} must be a non-empty list of non-empty strings", param=name)
        return {"ebnf": "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)}


def _structured_outputs(spec: dict[str, Any] | None) -> dict[str, tuple[str, Any]]:
    given: dict[str, tuple[str, Any]] = {}
    for key, value in (spec or {}).items():
        name = f"structured_outputs.{key}"
        if key in GRAMMAR_KEYS:
            if value is not None and value is not False:
                given[name] = (key, value)
        elif key in TUNING_KEYS:
            if value not in (None, False, ""):
                raise ApiError(400, f"{name} is not supported by this server", param=name)
        else:
            raise ApiError(400, f"{name} is not a structured-output field (one of {', '.join(GRAMMAR_KEYS)})",
                           param=name)
    return given
