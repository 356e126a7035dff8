"""/v1/messages without a server: Anthropic messages, system, tools and tool_choice become the chat
request's, the chat answer and its stream become the message and its events (tool calls whole or in
pieces, a stop sequence named and trimmed), errors come in Anthropic's shape and `x-api-key` is a key."""

from __future__ import annotations

import json

import pytest

from testing.asgi_call import RecordingClient, call_app
from zserve.http_proc.apis.anthropic.events import MessageEnvelope, MessagesStream
from zserve.http_proc.apis.anthropic.protocol import MessagesRequest
from zserve.http_proc.http_app import build_app
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics

WEATHER = {"name": "get_weather", "description": "the weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HI = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def chat_of(body: dict) -> dict:
    return MessagesRequest.model_validate(body).chat_request().model_dump(exclude_unset=True)


def post(body: dict, path: str = "/v1/messages", headers: dict | None = None, api_key: str = "",
         text: str = "hello") -> tuple[int, dict | bytes, RecordingClient]:
    client = RecordingClient(text=text)
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", api_key, 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate)
    status, response_headers, raw = call_app(build_app(state), "POST", path, body, headers)
    is_json = response_headers.get("content-type", "").startswith("application/json")
    return status, json.loads(raw) if is_json else raw, client


def test_system_blocks_tool_use_and_tool_results_become_chat_turns():
    body = {**HI, "system": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "a call", "signature": "s"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "and so?"}]},
    ]}
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert chat_of(body)["messages"] == [
        {"role": "system", "content": "be\nbrief"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},  # the tool's answer before the user's text
        {"role": "user", "content": "and so?"},
    ]


@pytest.mark.parametrize(("choice", "chat_choice", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "none"}, "none", None),
    ({"type": "any"}, "required", None),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     {"type": "function", "function": {"name": "get_weather"}}, False),
])
def test_tools_and_tool_choice_become_the_chats(choice, chat_choice, parallel):
    chat = chat_of({**HI, "tools": [WEATHER], "tool_choice": choice, "stop_sequences": ["END"], "top_k": 5})
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"], "description": "the weather"}}]
    assert chat["tool_choice"] == chat_choice and chat.get("parallel_tool_calls") == parallel
    assert chat["stop"] == ["END"] and chat["no_stop_trim"] is True and chat["top_k"] == 5


def test_output_config_format_is_the_chats_json_schema():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    chat = chat_of({**HI, "output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}})
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    status, answer, _ = post({**HI, "output_config": {"format": {"type": "text"}}})
    assert status == 400 and "output_config.format" in answer["error"]["message"]


def test_thinking_disabled_reaches_the_template_as_enable_thinking_false():
    assert chat_of({**HI, "thinking": {"type": "disabled"}})["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in chat_of({**HI, "thinking": {"type": "enabled", "budget_tokens": 1024}})


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({**HI, "max_tokens": 0}, "max_tokens"),
    ({**HI, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content"),
    ({**HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({**HI, "tool_choice": {"type": "tool"}}, "tool_choice"),
    ({**HI, "messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
    ({**HI, "lora_path": "adapters/x"}, "lora_path"),
])
def test_what_zserve_does_not_do_is_a_400_in_anthropics_shape(body, param):
    status, answer, client = post(body)
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert param in answer["error"]["message"]
    assert client.submitted == []


@pytest.mark.parametrize(("headers", "status"), [
    ({"x-api-key": "k"}, 200), ({"Authorization": "Bearer k"}, 200), ({"x-api-key": "kk"}, 401), ({}, 401),
])
def test_the_key_may_come_as_x_api_key_and_a_wrong_one_is_a_401_in_anthropics_shape(headers, status):
    got, answer, _ = post(HI, headers=headers, api_key="k")
    assert got == status, answer
    if status == 401:
        assert answer == {"type": "error", "error": {"type": "authentication_error", "message": answer["error"]["message"]}}
    got, answer, _ = post({"prompt": "hi", "max_tokens": 2}, "/v1/completions", headers, api_key="k")
    assert got == status and (status == 200 or answer["error"]["type"] == "authentication_error")  # OpenAI's shape


def test_the_message_of_a_chat_answer_names_the_stop_sequence_and_trims_it():
    envelope = MessageEnvelope("tiny", ["END", "STOP"])
    usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    chat = {"choices": [{"message": {"content": "Paris. STOP"}, "finish_reason": "stop"}], "usage": usage}
    message = envelope.from_chat(chat)
    assert message["content"] == [{"type": "text", "text": "Paris. "}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "STOP")
    assert message["usage"] == {"input_tokens": 5, "output_tokens": 4}
    eos = envelope.from_chat({**chat, "choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}]})
    assert (eos["stop_reason"], eos["stop_sequence"]) == ("end_turn", None)
    cut = envelope.from_chat({**chat, "choices": [{"message": {"content": "Par"}, "finish_reason": "length"}]})
    assert cut["stop_reason"] == "max_tokens"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}
    tools = envelope.from_chat({**chat, "choices": [{"message": {"content": None, "tool_calls": [call]},
                                                      "finish_reason": "tool_calls"}]})
    assert tools["content"] == [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "x"}}]
    assert tools["stop_reason"] == "tool_use"


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, "usage": usage}


USAGE = {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
ARGS = ['{"city": ', '"Paris"}', '{"city": "Lyon"}']


def call_delta(idx: int, call_id: str | None = None, arguments: str = "") -> dict:
    head = {"id": call_id, "type": "function"} if call_id else {}
    return {"tool_calls": [{"index": idx, **head,
                            "function": {"arguments": arguments, **({"name": "get_weather"} if call_id else {})}}]}


PIECED = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me"}), chunk({"content": " look."}),
          chunk(call_delta(0, "call_a")), chunk(call_delta(0, arguments=ARGS[0])),
          chunk(call_delta(0, arguments=ARGS[1])), chunk(call_delta(1, "call_b")),
          chunk(call_delta(1, arguments=ARGS[2]), "tool_calls"), chunk(usage=USAGE)]
WHOLE = [chunk({"content": "Let me look."}),
         chunk({"tool_calls": [{"index": i, "id": c, "type": "function", "function": {"name": "get_weather",
                                                                                      "arguments": a}}
                               for i, (c, a) in enumerate((("call_a", ARGS[0] + ARGS[1]), ("call_b", ARGS[2])))]},
               "tool_calls"),
         chunk(usage=USAGE)]


def events_of(chunks: list[dict], stop_sequences: tuple[str, ...] = ()) -> list[dict]:
    stream = MessagesStream(MessageEnvelope("tiny", list(stop_sequences)))
    events = stream.opening()
    for c in chunks:
        events += stream.feed(c)
    return events + stream.closing()


def accumulated(events: list[dict]) -> list[dict]:
    """The content blocks as the anthropic SDK accumulates them (by index)."""
    blocks: list[dict] = []
    for e in events:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append({**e["content_block"], "partial_json": ""})
        elif e["type"] == "content_block_delta":
            block, delta = blocks[e["index"]], e["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}[delta["type"]]
            block[key] += delta[key]
    return blocks


@pytest.mark.parametrize("chunks", [PIECED, WHOLE], ids=["pieced", "whole"])
def test_a_chat_stream_becomes_anthropics_event_sequence(chunks):
    events = events_of(chunks)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    blocks = accumulated(events)
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use"]
    assert blocks[0]["text"] == "Let me look."
    assert [(b["id"], b["name"], b["partial_json"]) for b in blocks[1:]] == [
        ("call_a", "get_weather", ARGS[0] + ARGS[1]), ("call_b", "get_weather", ARGS[2])]
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"] == {"input_tokens": 5, "output_tokens": 6}


@pytest.mark.parametrize("cut", range(0, 12))
def test_a_streamed_stop_sequence_is_held_back_named_and_trimmed_wherever_the_text_is_cut(cut):
    text = "Paris. STOP"
    events = events_of([chunk({"content": text[:cut]}), chunk({"content": text[cut:]}), chunk({"content": ""}, "stop"),
                        chunk(usage=USAGE)], ("STOP", "X"))
    assert accumulated(events)[0]["text"] == "Paris. "
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    plain = events_of([chunk({"content": "Paris."}, "stop")], ("STOP",))
    assert accumulated(plain)[0]["text"] == "Paris." and plain[-2]["delta"]["stop_reason"] == "end_turn"


def test_thinking_streams_as_a_thinking_block_before_the_text():
    events = events_of([chunk({"reasoning_content": "hmm"}), chunk({"content": "Paris"}, "stop"), chunk(usage=USAGE)])
    assert [(b["type"], b.get("thinking"), b.get("text")) for b in accumulated(events)] == [
        ("thinking", "hmm", None), ("text", None, "Paris")]


def test_the_route_streams_events_named_by_their_type():
    status, raw, client = post({**HI, "stream": True}, text="hello")
    assert status == 200, raw
    frames = [f for f in raw.decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    datas = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert names == [d["type"] for d in datas]
    assert accumulated(datas)[0]["text"] == "hello"
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens"
