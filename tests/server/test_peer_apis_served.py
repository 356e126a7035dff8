"""/v1/responses and /v1/messages on the real demo model, read with the real SDKs (openai's
`client.responses`, anthropic's `client.messages`): plain, streamed (the text streamed equals the text
answered), with a tool the answer is forced to call (its arguments parse and match the schema), a stop
sequence named, count_tokens, and the key as `x-api-key` (a wrong one: a 401 in Anthropic's shape).
One server for the module, behind --api-key, in float32: the texts compared are greedy answers of the same
prompt, and in bf16 the prefix cache's hit on the repeated prompt may flip a near tie of the first token."""

from __future__ import annotations

import json

import jsonschema
import pytest

from testing.server_process import free_port, start_server
from zserve.launcher.demo_model import demo_model_dir, missing_files

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_files(demo_model_dir())), reason="demo model not fetched (scripts/test.sh fetches it)"),
]

KEY = "peer-s3cret"
QUESTION = "What is the capital of France?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]}},
          "required": ["city"], "additionalProperties": False}
MODEL = demo_model_dir().name
GREEDY = {"temperature": 0}  # (the anthropic SDK 2.x has no temperature argument; the API still takes the field)
WEATHER = {"name": "get_weather", "description": "The weather in a city"}


@pytest.fixture(scope="module")
def port():
    http_port = free_port()
    server = start_server(demo_model_dir(), "--dtype", "float32", "--kv-cache-tokens", "4096", "--http-port", str(http_port),
                          "--api-key", KEY, timeout_s=600)
    yield http_port
    assert server.stop() == 0, server.log_tail()


@pytest.fixture(scope="module")
def oai(port):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(port):
    import anthropic

    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0)


def test_responses_plain_and_streamed(oai):
    plain = oai.responses.create(model=MODEL, input=QUESTION, max_output_tokens=16, temperature=0)
    assert "Paris" in plain.output_text and plain.status in ("completed", "incomplete")
    assert plain.usage.input_tokens > 5 and 0 < plain.usage.output_tokens <= 16
    events = list(oai.responses.create(input=QUESTION, max_output_tokens=16, temperature=0, model=MODEL,
                                       stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    with oai.responses.stream(input=QUESTION, max_output_tokens=16, temperature=0, model=MODEL) as stream:
        final = stream.get_final_response()  # the SDK's own accumulator checks the event sequence
    assert final.output_text == plain.output_text


def test_responses_with_a_forced_tool(oai):
    tool = {"type": "function", **WEATHER, "parameters": SCHEMA}
    ask = {"input": "What is the weather in Paris?", "tools": [tool], "max_output_tokens": 30, "temperature": 0,
           "tool_choice": {"type": "function", "name": "get_weather"}, "model": MODEL}
    answer = oai.responses.create(**ask)
    calls = [item for item in answer.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
    events = list(oai.responses.create(**ask, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert streamed == calls[0].arguments
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [("get_weather", calls[0].arguments)]
    # the call and its output go back as input items, and the model answers them
    follow = oai.responses.create(**{**ask, "tool_choice": "none", "max_output_tokens": 8, "input": [
        {"role": "user", "content": ask["input"]}, calls[0].model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]})
    assert follow.output_text and not [item for item in follow.output if item.type == "function_call"]


def test_messages_plain_streamed_and_counted(claude):
    messages = [{"role": "user", "content": QUESTION}]
    plain = claude.messages.create(model=MODEL, max_tokens=16, messages=messages, extra_body=GREEDY)
    text = "".join(block.text for block in plain.content if block.type == "text")
    assert "Paris" in text and plain.stop_reason in ("end_turn", "max_tokens") and plain.id.startswith("msg_")
    assert plain.usage.input_tokens > 5 and 0 < plain.usage.output_tokens <= 16
    with claude.messages.stream(model=MODEL, max_tokens=16, messages=messages, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.stop_reason == plain.stop_reason
    assert final.usage.input_tokens == plain.usage.input_tokens
    assert claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens == plain.usage.input_tokens


def test_messages_name_the_stop_sequence(claude):
    messages = [{"role": "user", "content": QUESTION}]
    answer = claude.messages.create(model=MODEL, max_tokens=16, messages=messages, extra_body=GREEDY,
                                    stop_sequences=["Paris"])
    assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", "Paris")
    text = "".join(block.text for block in answer.content if block.type == "text")
    assert "Paris" not in text
    with claude.messages.stream(model=MODEL, max_tokens=16, messages=messages, extra_body=GREEDY,
                                stop_sequences=["Paris"]) as stream:
        assert "".join(stream.text_stream) == text
        assert stream.get_final_message().stop_sequence == "Paris"


def test_messages_with_a_forced_tool(claude):
    ask = {"model": MODEL, "max_tokens": 30, "extra_body": GREEDY, "tools": [{**WEATHER, "input_schema": SCHEMA}],
           "tool_choice": {"type": "tool", "name": "get_weather"},
           "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    answer = claude.messages.create(**ask)
    uses = [block for block in answer.content if block.type == "tool_use"]
    assert answer.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, SCHEMA)
    with claude.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", uses[0].input)]
    # the call and its answer go back as a conversation, and the model answers it
    follow = claude.messages.create(**{**ask, "tool_choice": {"type": "none"}, "max_tokens": 8, "messages": [
        *ask["messages"], {"role": "assistant", "content": [uses[0].model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]}]})
    assert follow.stop_reason in ("end_turn", "max_tokens") and follow.content


def test_messages_output_config_format_constrains_the_answer(claude):
    answer = claude.messages.create(model=MODEL, max_tokens=30, extra_body=GREEDY,
                                    output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
                                    messages=[{"role": "user", "content": "Which city is the capital of France?"}])
    jsonschema.validate(json.loads(answer.content[0].text), SCHEMA)


def test_a_wrong_x_api_key_is_a_401_in_anthropics_shape(port):
    import anthropic

    wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY + "x", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 401
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"

