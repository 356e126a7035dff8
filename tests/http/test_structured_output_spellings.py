"""Every structured-output spelling (OpenAI's response_format, SGLang's regex / ebnf, vLLM's structured_outputs
and guided_*) becomes the one grammar field the scheduler compiles; two spellings at once are a 400 naming both.
That the grammar then constrains a served model's text: tests/server/test_structured_output_served.py."""

from __future__ import annotations

import json

import pytest

from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest
from zserve.http_proc.shared.api_error import ApiError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES = [{"role": "user", "content": "hi"}]
SPELLINGS = [  # (the request's fields, the grammar field the scheduler gets)
    ({"structured_outputs": {"json": SCHEMA}}, {"json_schema": json.dumps(SCHEMA)}),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, {"json_schema": json.dumps(SCHEMA)}),
    ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"ebnf": 'root ::= "yes" | "no"'}),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"ebnf": 'root ::= "a"'}),
    ({"structured_outputs": {"json_object": True}}, {"json_object": True}),
    ({"guided_json": SCHEMA}, {"json_schema": json.dumps(SCHEMA)}),
    ({"guided_regex": "[0-9]+"}, {"regex": "[0-9]+"}),
    ({"guided_choice": ['say "hi"', "a\\b"]}, {"ebnf": 'root ::= "say \\"hi\\"" | "a\\\\b"'}),
    ({"guided_grammar": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
    ({"regex": "[0-9]+"}, {"regex": "[0-9]+"}),
    ({"ebnf": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}},
     {"json_schema": json.dumps(SCHEMA)}),
    ({"response_format": {"type": "text"}, "guided_regex": "a"}, {"regex": "a"}),  # text is no grammar
    ({"structured_outputs": {"json": None, "regex": "a", "disable_any_whitespace": False}}, {"regex": "a"}),
]
GRAMMAR_KEYS = ("json_object", "json_schema", "regex", "ebnf")


def grammar_of(request) -> dict:
    [sub] = request.sub_requests()
    return {k: v for k, v in sub.sampling.items() if k in GRAMMAR_KEYS}


@pytest.mark.parametrize(("fields", "expected"), SPELLINGS)
def test_each_spelling_reaches_the_grammar_on_both_routes(fields, expected):
    assert grammar_of(ChatCompletionRequest(messages=MESSAGES, **fields)) == expected
    assert grammar_of(CompletionRequest(prompt="hi", **fields)) == expected


@pytest.mark.parametrize(("fields", "names"), [
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "guided_json and response_format"),
    ({"guided_regex": "a", "regex": "b"}, "guided_regex and regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.regex and structured_outputs.choice"),
    ({"guided_choice": ["a"], "structured_outputs": {"grammar": "root ::= \"a\""}},
     "guided_choice and structured_outputs.grammar"),
    ({"ebnf": "root ::= \"a\"", "guided_grammar": "root ::= \"a\""}, "guided_grammar and ebnf"),
])
def test_two_spellings_at_once_are_a_400_naming_both(fields, names):
    for request in (ChatCompletionRequest(messages=MESSAGES, **fields), CompletionRequest(prompt="hi", **fields)):
        with pytest.raises(ApiError) as caught:
            request.sub_requests()
        assert caught.value.status == 400 and f"give one structured-output field; got {names}" in caught.value.message


@pytest.mark.parametrize(("fields", "param"), [
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"jsn": SCHEMA}}, "structured_outputs.jsn"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"choice": [""]}}, "structured_outputs.choice"),
])
def test_what_the_grammar_cannot_honour_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as caught:
        ChatCompletionRequest(messages=MESSAGES, **fields).sub_requests()
    assert caught.value.status == 400 and caught.value.param == param and param in caught.value.message


def test_a_forced_tool_choice_and_a_vllm_spelling_together_are_refused():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request = ChatCompletionRequest(messages=MESSAGES, tools=tools, tool_choice="required", guided_regex="a")
    with pytest.raises(ApiError, match="cannot be combined with structured output"):
        request.sub_requests()
