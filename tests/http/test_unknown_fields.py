"""Request fields the OpenAI models do not declare: ignored and logged once per name (vLLM's way),
or a 400 naming them under --strict-requests; known fields stay strictly validated either way.
Malformed `tools` are a 400 naming the field."""

from __future__ import annotations

import json
import logging

import pytest

from zserve.http_proc.apis.openai.protocol import ChatCompletionRequest, CompletionRequest
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.request_body import parse_body
from zserve.http_proc.shared.unknown_fields import UnknownFieldPolicy, field_path

CHAT = "/v1/chat/completions"
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}


def chat_body(**fields) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "unknown request field" in r.getMessage()]


def test_unknown_fields_at_every_level_are_ignored_and_each_name_logged_once(caplog):
    policy = UnknownFieldPolicy()
    raw = json.dumps({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]},
                     {"role": "assistant", "content": "b", "reasoning_content": "..."},
                     {"role": "user", "content": "c", "reasoning_content": "..."}],
        "tools": [{**TOOL, "function": {**TOOL["function"], "x_new": 1}}],
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "service_tier": "auto", "prompt_cache_key": "k",
    }).encode()
    with caplog.at_level(logging.WARNING, logger="http_proc"):
        for _ in range(3):  # the same fields in three requests: still one line per name
            body = parse_body(ChatCompletionRequest, raw)
            policy.check(body, CHAT)
            [sub] = body.sub_requests()  # and the request runs
    lines = warnings_of(caplog)
    names = ["service_tier", "prompt_cache_key", "stream_options.continuous_usage_stats", "messages.content.cache_control",
             "messages.reasoning_content", "tools.function.x_new"]
    assert sorted(lines) == sorted(f"ignoring unknown request field {n!r} in {CHAT} (sent by a newer client?); "
                                   "--strict-requests refuses such requests" for n in names)
    # the ignored fields reach neither the prompt nor the template's tools
    assert sub.prompt["messages"][0] == {"role": "user", "content": "a"} and "reasoning_content" not in sub.prompt["messages"][1]
    assert sub.prompt["tools"] == [TOOL]


def test_strict_requests_keep_the_400_naming_the_field():
    body = parse_body(ChatCompletionRequest, chat_body(frobnicate=1, stream_options={"include_usage": True, "zap": 2}, stream=True))
    with pytest.raises(ApiError) as info:
        UnknownFieldPolicy(strict=True).check(body, CHAT)
    assert info.value.status == 400 and info.value.param == "frobnicate"
    assert "frobnicate: Extra inputs are not permitted" in info.value.message and "stream_options.zap" in info.value.message
    UnknownFieldPolicy(strict=True).check(parse_body(ChatCompletionRequest, chat_body(max_tokens=3)), CHAT)  # known fields pass


@pytest.mark.parametrize("strict", [False, True])
def test_known_fields_are_validated_whatever_the_mode(strict):
    for model, raw, needle in [
        (CompletionRequest, b'{"prompt": "a", "temperature": "hot", "new_field": 1}', "temperature"),
        (ChatCompletionRequest, chat_body(messages=[{"role": "user", "content": 5}], new_field=1), "messages[0].content"),
        (ChatCompletionRequest, chat_body(parallel_tool_calls="sometimes"), "parallel_tool_calls"),
    ]:
        with pytest.raises(ApiError, match=needle.replace("[", r"\[")) as info:
            UnknownFieldPolicy(strict=strict).check(parse_body(model, raw), CHAT)
        assert info.value.status == 400


def test_a_client_inventing_names_cannot_grow_the_warned_set():
    policy = UnknownFieldPolicy()
    for i in range(1000):
        policy.check(parse_body(CompletionRequest, json.dumps({"prompt": "a", f"f{i}": 1}).encode()), "/v1/completions")
    assert len(policy.warned) == 256


MALFORMED_TOOLS = [
    ([{"type": "function"}], "tools[0].function", "Field required"),
    ([TOOL, {"type": "function", "function": {"description": "no name"}}], "tools[1].function.name", "Field required"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name", "at least 1 character"),
    ([{"type": "function", "function": {"name": 7}}], "tools[0].function.name", "valid string"),
    ([{"type": "function", "function": {"name": "f", "parameters": "object"}}], "tools[0].function.parameters", "object"),
    ([{"type": "function", "function": {"name": "f", "description": ["x"]}}], "tools[0].function.description", "valid string"),
    ([{"function": {"name": "f"}}], "tools[0].type", "Field required"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type", "'function'"),
    (["f"], "tools[0]", "object"),
    ({"type": "function"}, "tools", "valid array"),
]


@pytest.mark.parametrize(("tools", "path", "reason"), MALFORMED_TOOLS, ids=[p for _, p, _ in MALFORMED_TOOLS])
def test_malformed_tools_are_a_400_naming_the_field(tools, path, reason):
    with pytest.raises(ApiError) as info:
        parse_body(ChatCompletionRequest, chat_body(tools=tools))
    assert info.value.status == 400 and info.value.param == path
    assert f"{path}: " in info.value.message and reason in info.value.message


def test_field_paths_read_as_openai_writes_them():
    assert field_path(("messages", 0, "content", 2, "text")) == "messages[0].content[2].text"
    assert field_path(("tools",)) == "tools" and field_path(()) == "body"
