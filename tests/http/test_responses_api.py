"""/v1/responses without a server: Responses items become the chat request's messages and tools, the chat
answer and its stream become the response object and its events (tool calls whole or in pieces), and what
the Responses API has and zserve does not do is a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from testing.asgi_call import RecordingClient, call_app
from zserve.http_proc.apis.responses.events import ResponseEnvelope, ResponsesStream
from zserve.http_proc.apis.responses.protocol import ResponsesRequest
from zserve.http_proc.http_app import build_app
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def chat_of(body: dict) -> dict:
    return ResponsesRequest.model_validate(body).chat_request().model_dump(exclude_unset=True)


def post(body: dict, text: str = "hello") -> tuple[int, bytes, RecordingClient]:
    client = RecordingClient(text=text)
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", "", 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate)
    status, _, raw = call_app(build_app(state), "POST", "/v1/responses", body)
    return status, raw, client


def test_a_string_input_and_instructions_become_system_and_user_turns():
    chat = chat_of({"input": "hi", "instructions": "be brief", "max_output_tokens": 7, "temperature": 0.5})
    assert [m for m in chat["messages"]] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat["max_tokens"] == 7 and chat["temperature"] == 0.5 and "stream_options" not in chat


def test_items_become_chat_turns_calls_and_tool_answers():
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in "},
                                                        {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Lyon\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny and rain."}]},
    ]
    messages = chat_of({"input": items})["messages"]
    calls = [{"id": c, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city},
                                                                                                    separators=(",", ":"))}}
             for c, city in (("c1", "Paris"), ("c2", "Lyon"))]
    assert messages == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": calls},  # both calls in one assistant turn
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Sunny and rain."},
    ]


def test_flat_tools_tool_choice_and_text_format_become_the_chats():
    chat = chat_of({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
                    "parallel_tool_calls": False,
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}})
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "the weather", "parameters": WEATHER["parameters"]}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content"),
    ({"input": [{"type": "file_search_call", "id": "x"}]}, "input[0].type"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"lora_path": "adapters/x"}, "lora_path"),
])
def test_what_zserve_does_not_do_is_a_400_naming_the_field(body, param):
    status, raw, client = post({"input": "hi", **body})
    assert status == 400, raw
    assert json.loads(raw)["error"]["param"] == param
    assert client.submitted == []


def test_store_false_and_metadata_are_accepted():
    status, raw, _ = post({"input": "hi", "store": False, "metadata": {"k": "v"}, "max_output_tokens": 2})
    assert status == 200, raw
    assert json.loads(raw)["metadata"] == {"k": "v"}


def test_the_response_object_of_a_chat_answer_with_calls_and_a_cut_answer():
    envelope = ResponseEnvelope(ResponsesRequest.model_validate({"input": "hi"}), "tiny")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"x\"}"}}
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
    response = envelope.from_chat(chat)
    assert response["object"] == "response" and response["id"].startswith("resp_")
    assert response["status"] == "completed" and response["incomplete_details"] is None
    message, function_call = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Let me look."
    assert {k: function_call[k] for k in ("type", "call_id", "name", "arguments")} == {
        "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"x\"}"}
    assert response["usage"]["input_tokens"] == 5 and response["usage"]["output_tokens"] == 4
    assert response["usage"]["total_tokens"] == 9
    cut = envelope.from_chat({**chat, "choices": [{"message": {"content": "abc"}, "finish_reason": "length"}]})
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["output"][0]["status"] == "incomplete"  # the message item too, as OpenAI marks it


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, "usage": usage}


def tool_delta(idx: int, call_id: str | None = None, name: str | None = None, arguments: str = "") -> dict:
    function = {"arguments": arguments, **({"name": name} if name else {})}
    return {"tool_calls": [{"index": idx, **({"id": call_id, "type": "function"} if call_id else {}),
                            "function": function}]}


USAGE = {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
ARGS = ['{"city": ', '"Paris"}', '{"city": "Lyon"}']


def pieced_chunks() -> list[dict]:
    """vLLM's way: each call's first delta has its id and name and no arguments, then argument pieces."""
    return [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me"}), chunk({"content": " look."}),
            chunk(tool_delta(0, "call_a", "get_weather")), chunk(tool_delta(0, arguments=ARGS[0])),
            chunk(tool_delta(0, arguments=ARGS[1])), chunk(tool_delta(1, "call_b", "get_weather")),
            chunk(tool_delta(1, arguments=ARGS[2]), "tool_calls"), chunk(usage=USAGE)]


def whole_chunks() -> list[dict]:
    """The calls whole in one delta at the end."""
    calls = [{"index": i, "id": c, "type": "function", "function": {"name": "get_weather", "arguments": a}}
             for i, (c, a) in enumerate((("call_a", ARGS[0] + ARGS[1]), ("call_b", ARGS[2])))]
    return [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me look."}),
            chunk({"tool_calls": calls}, "tool_calls"), chunk(usage=USAGE)]


def events_of(chunks: list[dict]) -> list[dict]:
    stream = ResponsesStream(ResponseEnvelope(ResponsesRequest.model_validate({"input": "hi"}), "tiny"))
    events = stream.opening()
    for c in chunks:
        events += stream.feed(c)
    return events + stream.closing()


@pytest.mark.parametrize("chunks", [pieced_chunks(), whole_chunks()], ids=["pieced", "whole"])
def test_a_chat_stream_becomes_the_responses_event_sequence(chunks):
    events = events_of(chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    text_done = kinds.index("response.output_text.done")
    assert kinds[text_done:text_done + 3] == ["response.output_text.done", "response.content_part.done",
                                              "response.output_item.done"]
    assert kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Let me look."
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2]
    arguments = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            arguments[e["output_index"]] = arguments.get(e["output_index"], "") + e["delta"]
    assert arguments == {1: ARGS[0] + ARGS[1], 2: ARGS[2]}
    done = {e["output_index"]: e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"}
    assert done == arguments
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call", "function_call"]
    assert [item.get("call_id") for item in final["output"][1:]] == ["call_a", "call_b"]
    assert [item["arguments"] for item in final["output"][1:]] == [ARGS[0] + ARGS[1], ARGS[2]]
    item_ids = {e["output_index"]: e["item"]["id"] for e in added}
    assert [item["id"] for item in final["output"]] == [item_ids[0], item_ids[1], item_ids[2]]
    assert final["usage"]["output_tokens"] == 6


def test_a_streamed_answer_cut_by_max_output_tokens_ends_incomplete():
    events = events_of([chunk({"content": "abc"}), chunk({"content": ""}, "length"), chunk(usage=USAGE)])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_thinking_streams_as_a_reasoning_item_before_the_message():
    events = events_of([chunk({"reasoning_content": "hmm"}), chunk({"reasoning_content": "..."}),
                        chunk({"content": "Paris"}, "stop"), chunk(usage=USAGE)])
    final = events[-1]["response"]["output"]
    assert [item["type"] for item in final] == ["reasoning", "message"]
    assert final[0]["content"][0]["text"] == "hmm..." and final[1]["content"][0]["text"] == "Paris"


def test_the_route_streams_events_named_by_their_type():
    status, raw, client = post({"input": "hi", "stream": True, "max_output_tokens": 2}, text="hello")
    assert status == 200, raw
    frames = [f for f in raw.decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    datas = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert names == [d["type"] for d in datas]
    assert "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta") == "hello"
    assert client.submitted[0]["max_tokens"] == 2
