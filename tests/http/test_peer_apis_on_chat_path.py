"""/v1/responses and /v1/messages through the chat path's own parsers, without a server: a Qwen3-style answer
(thinking, then a Hermes tool call) comes back as a reasoning item / thinking block and a function_call /
tool_use, streamed and not, the streamed calls' arguments equal to the answered ones."""

from __future__ import annotations

import json

import pytest

from testing.asgi_call import RecordingClient, call_app
from zserve.client.types import GenerateResult, Usage, server_error
from zserve.common.error_code import ErrorCode
from zserve.http_proc.http_app import build_app
from zserve.http_proc.reasoning import ReasoningParser
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.tools.parser import ToolCallParser

ANSWER = '<think>The user wants weather.</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def post(path: str, body: dict) -> tuple[int, bytes]:
    client = RecordingClient(text=ANSWER)
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", "", 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate,
                      tool_parser=ToolCallParser("hermes"), reasoning_parser=ReasoningParser("qwen3"))
    status, _, raw = call_app(build_app(state), "POST", path, body)
    assert status == 200, raw
    return status, raw


def events(raw: bytes) -> list[dict]:
    return [json.loads(frame.split("\n")[1].removeprefix("data: ")) for frame in raw.decode().split("\n\n") if frame]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_thinking_and_a_hermes_call(stream):
    body = {"input": "weather?", "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}],
            "stream": stream}
    _, raw = post("/v1/responses", body)
    response = events(raw)[-1]["response"] if stream else json.loads(raw)
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "The user wants weather."
    call = response["output"][1]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    if stream:
        deltas = "".join(e["delta"] for e in events(raw) if e["type"] == "response.function_call_arguments.delta")
        assert deltas == call["arguments"]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_thinking_and_a_hermes_call(stream):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "weather?"}], "stream": stream,
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}]}
    _, raw = post("/v1/messages", body)
    if not stream:
        message = json.loads(raw)
        assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
        assert message["content"][1]["input"] == {"city": "Paris"} and message["stop_reason"] == "tool_use"
        return
    stream_events = events(raw)
    assert stream_events[-2]["delta"]["stop_reason"] == "tool_use"
    starts = [e["content_block"]["type"] for e in stream_events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    partial = "".join(e["delta"]["partial_json"] for e in stream_events
                      if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}


class FailingClient(RecordingClient):
    """Answers one piece of text, then the server fails the request."""

    async def stream_outputs_of(self, req_id: int):
        yield "Par", GenerateResult(req_id, "Par", [7], None, Usage(prompt_tokens=3, completion_tokens=1))
        raise server_error("the model process died", ErrorCode.GONE, req_id)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", {"input": "hi", "stream": True}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
])
def test_a_failure_mid_stream_is_an_error_event_in_the_apis_shape(path, body):
    client = FailingClient()
    health = HealthMonitor(client)
    health.state = "ready"
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health,
                      GatePolicy.build("127.0.0.1", "", "", "", 1 << 20))
    status, _, raw = call_app(build_app(state), "POST", path, body)
    assert status == 200  # the stream had begun
    last = events(raw)[-1]
    frames = [frame for frame in raw.decode().split("\n\n") if frame]
    assert frames[-1].startswith("event: error\n")
    if path == "/v1/responses":  # ResponseErrorEvent
        assert last["type"] == "error" and "model process died" in last["message"] and "sequence_number" in last
    else:
        assert last == {"type": "error", "error": {"type": "api_error", "message": "the model process died"}}
