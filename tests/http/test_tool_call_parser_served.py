"""--tool-call-parser reaches the server: the tiny model's own chat template writes no tool format
(so without the flag calls stay text), and with `--tool-call-parser pythonic` a regex that makes the
random model write `[get_weather(city="Paris"), add(a=1, b=2)]` comes back as two tool calls,
streamed (through the openai SDK) as vLLM streams them: each name once, then argument pieces that
concatenate to the non-streamed arguments. `--enable-auto-tool-choice` is accepted alongside."""

from __future__ import annotations

import json

import pytest

from testing.server_process import free_port, start_server

ANSWER = '[get_weather(city="Paris"), add(a=1, b=2)]'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]


def regex_of(text: str) -> str:
    """`text` as a regex that matches it alone (xgrammar's regex: escape the metacharacters only)."""
    return "".join("\\" + ch if ch in "\\^$.|?*+()[]{}" else ch for ch in text)


@pytest.fixture(scope="module")
def oai(model_dir):
    import openai

    http_port = free_port()
    server = start_server(model_dir, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "4096",
                          "--tool-call-parser", "pythonic", "--enable-auto-tool-choice", timeout_s=240)
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
    finally:
        assert server.stop() == 0, server.log()


def test_the_flags_format_is_parsed_streamed_and_not(oai, model_dir):
    kwargs = dict(model=model_dir.name, messages=[{"role": "user", "content": "Weather in Paris, and 1 + 2?"}],
                  max_tokens=80, tools=TOOLS, tool_choice="auto", extra_body={"regex": regex_of(ANSWER)})
    choice = oai.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [(name, json.loads(args)) for name, args in calls] == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]

    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # no markup leaks into content
    entries = [e for c in chunks if c.choices and c.choices[0].delta.tool_calls for e in c.choices[0].delta.tool_calls]
    announced = [e for e in entries if e.id is not None]
    assert [(e.index, e.function.name, e.function.arguments) for e in announced] == [(0, "get_weather", ""), (1, "add", "")]
    streamed = ["".join(e.function.arguments or "" for e in entries if e.index == i) for i in range(2)]
    assert streamed == [args for _, args in calls]
    assert len(entries) - len(announced) > 2  # the arguments came in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
