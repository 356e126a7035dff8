"""With --reasoning-parser qwen3 and the thinking on, a grammar starts after `</think>` (as vLLM's):
the thinking is free text, the answer after it is constrained (response_format json_schema, a
named tool_choice), streamed and not, on a real server read with the openai SDK.

The tiny model is random: `</think>` is a token of its own here (as in Qwen3's vocabulary) and a
logit_bias of 1.9 on it makes the greedy answer close its thinking after one free token (the
bias lies between the model's gaps at the first two tokens, 2.5 and 1.3 in fp32: the test asserts
that the thinking is there). The same request with no grammar and the thinking kept in content
(separate_reasoning false) is the oracle: the thinking must be its text up to `</think>`, and its
answer must differ from the constrained one (the grammar acted)."""

from __future__ import annotations

import json

import pytest

from testing.qwen3_thinking import THINK_CLOSE_ID, make_tiny_qwen3_thinking
from testing.server_process import free_port, start_server

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
CLOSE_BIAS = {str(THINK_CLOSE_ID): 1.9}
COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"],
         "additionalProperties": False}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR}}
TOOLS = [{"type": "function", "function": {"name": "paint", "parameters": COLOR}}]
PAINT = {"type": "function", "function": {"name": "paint"}}


@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    import openai

    model_dir = make_tiny_qwen3_thinking(tmp_path_factory.mktemp("qwen3_think_tokens"), think_tokens=True)
    port = free_port()
    server = start_server(model_dir, "--http-port", str(port), "--reasoning-parser", "qwen3", "--dtype", "float32",
                          "--num-threads", "1", "--kv-cache-tokens", "4096")
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0), model_dir.name
    finally:
        assert server.stop() == 0


def ask(oai, max_tokens=30, stream=False, **fields):
    client, model = oai
    extra = {"logit_bias": CLOSE_BIAS}  # through extra_body: the SDK's logit_bias wants int keys
    for name in ("separate_reasoning", "chat_template_kwargs"):
        if name in fields:
            extra[name] = fields.pop(name)
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0,
                                          stream=stream, extra_body=extra, **fields)


def free_thinking(oai, **fields) -> tuple[str, str]:
    """The oracle: (thinking, answer) of the free greedy text, no grammar."""
    raw = ask(oai, separate_reasoning=False, **fields).choices[0].message.content
    thinking, closed, answer = raw.partition("</think>")
    assert closed and thinking, f"the bias no longer closes the thinking after free text: {raw!r}"
    return thinking, answer


def streamed(chunks) -> tuple[str, str, list]:
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    thinking = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    return thinking, "".join(d.content or "" for d in deltas), [c for d in deltas for c in d.tool_calls or []]


def test_a_json_schema_constrains_the_answer_after_free_thinking(oai):
    thinking, free_answer = free_thinking(oai)
    message = ask(oai, response_format=SCHEMA_FORMAT).choices[0].message
    assert message.reasoning_content == thinking
    assert json.loads(message.content)["color"] in ("red", "blue") and message.content != free_answer
    s_thinking, s_content, _ = streamed(ask(oai, response_format=SCHEMA_FORMAT, stream=True))
    assert (s_thinking, s_content) == (thinking, message.content)


def test_a_named_tool_choice_constrains_the_call_after_free_thinking(oai):
    thinking, _ = free_thinking(oai, tools=TOOLS, tool_choice="none")  # the same prompt (tools), no grammar
    answer = ask(oai, tools=TOOLS, tool_choice=PAINT)
    message = answer.choices[0].message
    assert message.reasoning_content == thinking and not message.content
    [call] = message.tool_calls
    assert call.function.name == "paint" and json.loads(call.function.arguments)["color"] in ("red", "blue")
    s_thinking, s_content, calls = streamed(ask(oai, tools=TOOLS, tool_choice=PAINT, stream=True))
    assert s_thinking == thinking and not s_content.strip()
    assert calls[0].function.name == "paint"
    assert "".join(c.function.arguments or "" for c in calls) == call.function.arguments


def test_with_the_thinking_off_the_grammar_applies_from_the_first_token(oai):
    message = ask(oai, response_format=SCHEMA_FORMAT, chat_template_kwargs={"enable_thinking": False})
    message = message.choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert json.loads(message.content)["color"] in ("red", "blue")
