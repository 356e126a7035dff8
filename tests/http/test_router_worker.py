"""What sglang-router (0.3.2) needs of a worker, checked on the ASGI app with a recording client double:
/server_info and /model_info (and the /get_ names) and /get_load in SGLang's shapes, the request bodies the router
actually forwards (captured from it: every one adds SGLang's extra fields) accepted with one INFO note per
SGLang field name, and the SGLang fields zserve honours (skip_special_tokens, no_stop_trim,
continue_final_message) sent on to the server. What they do to the text: tests/detokenizer,
tests/tokenizer and the loopback test tests/server/test_sglang_router.py."""

from __future__ import annotations

import json
import logging

import pytest

from testing.asgi_call import RecordingClient, call_app
from zserve.http_proc.http_app import build_app
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_gate import GatePolicy
from zserve.http_proc.shared.server_info import ServerInfo
from zserve.http_proc.shared.server_metrics import ServerMetrics
from zserve.http_proc.shared.unknown_fields import UnknownFieldPolicy

MESSAGES = [{"role": "user", "content": "hi"}]
# Bodies as sglang-router 0.3.2 forwards them (captured): the client sent {"messages", "max_tokens": 4} (no model),
# {"model", "prompt", "max_tokens": 4}, and {"text", "sampling_params"} / {"input_ids"}.
ROUTER_CHAT = {"messages": MESSAGES, "model": "unknown", "logprobs": False, "max_completion_tokens": 4, "stream": False,
               "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
               "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False}
ROUTER_COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": False, "echo": False, "no_stop_trim": False,
                     "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
ROUTER_EXTRAS = {"return_text_in_logprobs": False, "stream": False, "log_metrics": True, "return_hidden_states": False,
                 "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False}
ROUTER_GENERATE = {"text": "hi", "model": None, "sampling_params": {"max_new_tokens": 4}, **ROUTER_EXTRAS}
ROUTER_GENERATE_IDS = {"model": None, "input_ids": [5, 6, 7], **ROUTER_EXTRAS}  # no sampling_params, no text


def make_app(client: RecordingClient, *, strict: bool = False, info: ServerInfo | None = None):
    health = HealthMonitor(client)
    health.state = "ready"
    gate = GatePolicy.build("127.0.0.1", "", "", "", 1 << 20)
    state = HttpState(client, "tiny", "/models/tiny", 512, ServerMetrics("tiny"), health, gate,
                      unknown_fields=UnknownFieldPolicy(strict=strict), server_info=info)
    return build_app(state)


def get_json(app, path: str) -> tuple[int, dict]:
    status, _, body = call_app(app, "GET", path)
    return status, json.loads(body)


def post_json(app, path: str, body: dict) -> tuple[int, dict]:
    status, _, raw = call_app(app, "POST", path, body)
    return status, json.loads(raw)


def test_server_info_carries_what_the_router_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    info = ServerInfo(str(tmp_path), str(tmp_path), "tiny", 512, tp_size=2, page_size=4, port=8000)
    app = make_app(RecordingClient(), info=info)
    for path in ("/server_info", "/get_server_info"):
        status, body = get_json(app, path)
        assert status == 200
        # the router's model id (served_model_name, else model_path), its labels, and its tokenizer's path
        assert (body["served_model_name"], body["model_path"], body["tokenizer_path"]) == ("tiny", str(tmp_path), str(tmp_path))
        assert (body["tp_size"], body["dp_size"], body["context_length"], body["max_req_input_len"]) == (2, 1, 512, 511)
        assert body["max_total_num_tokens"] == (100 + 20 + 8) * 4  # the KV pool's pages (free + cached + used) x page size
    for path in ("/model_info", "/get_model_info"):
        status, body = get_json(app, path)
        assert status == 200 and body["is_generation"] is True
        assert (body["model_path"], body["tokenizer_path"], body["served_model_name"]) == (str(tmp_path), str(tmp_path), "tiny")
        assert (body["model_type"], body["architectures"], body["weight_version"]) == ("llama", ["LlamaForCausalLM"], "default")


def test_get_load_is_sglangs_list_with_requests_and_kv_tokens_in_use():
    """power_of_two reads the sum of num_tokens over the list (an object reads as load -1)."""
    client = RecordingClient()
    client.stats_reply.update(num_waiting=1, num_running=2, num_prefilling=1)
    status, body = get_json(make_app(client, info=ServerInfo("/m", "/m", "tiny", 512, page_size=4)), "/get_load")
    # KV in use: the requests' own pages (8) and the cached pages they lock (20 cached - 15 evictable), in tokens
    assert (status, body) == (200, [{"dp_rank": 0, "num_reqs": 4, "num_waiting_reqs": 1, "num_tokens": (8 + 20 - 15) * 4}])


def test_server_info_answers_without_the_schedulers_numbers_when_stats_fail():
    class NoStats(RecordingClient):
        async def stats(self) -> dict:
            raise ConnectionError("the server is gone")

    status, body = get_json(make_app(NoStats()), "/server_info")
    assert status == 200 and body["served_model_name"] == "tiny" and "max_total_num_tokens" not in body
    status, body = get_json(make_app(NoStats()), "/model_info")  # no config.json there: model_type unknown
    assert status == 200 and body["model_path"] == "/models/tiny" and body["model_type"] is None
    assert get_json(make_app(NoStats()), "/get_load")[0] == 503


def info_notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "accepting SGLang request field" in r.getMessage()]


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("strict", [False, True])
def test_the_routers_bodies_succeed_with_one_info_note_per_sglang_field(caplog, strict):
    client = RecordingClient(text="hello")
    app = make_app(client, strict=strict)
    with caplog.at_level(logging.INFO, logger="http_proc"):
        for _ in range(2):  # the second round notes nothing new
            status, chat = post_json(app, "/v1/chat/completions", ROUTER_CHAT)
            assert status == 200 and chat["choices"][0]["message"]["content"] == "hello" and chat["model"] == "tiny"
            status, completion = post_json(app, "/v1/completions", ROUTER_COMPLETION)
            assert status == 200 and completion["choices"][0]["text"] == "hello"
            status, generated = post_json(app, "/generate", ROUTER_GENERATE)
            assert status == 200 and generated["text"] == "hello" and "meta_info" in generated  # answered in SGLang's shape
            status, generated = post_json(app, "/generate", ROUTER_GENERATE_IDS)
            assert status == 200 and generated["text"] == "hello" and "meta_info" in generated
    assert warnings_of(caplog) == []
    noted = sorted(line.split("'")[1] for line in info_notes(caplog))
    # (separate_reasoning and stream_reasoning are honoured on the chat route, not noted)
    assert noted == sorted(["return_hidden_states", "model", "return_text_in_logprobs",
                            "log_metrics", "background", "no_logs", "return_bytes", "return_entropy"])
    # defaults stay defaults: nothing extra reaches the server for them
    chat_sent, completion_sent, generate_sent, ids_sent = client.submitted[:4]
    assert chat_sent["messages"] == MESSAGES and chat_sent["max_tokens"] == 4 and "continue_final_message" not in chat_sent
    assert not {"skip_special_tokens", "no_stop_trim"} & (set(chat_sent) | set(completion_sent))
    assert (generate_sent["prompt"], generate_sent["max_tokens"]) == ("hi", 4)
    assert (ids_sent["input_ids"], ids_sent["max_tokens"]) == ([5, 6, 7], 128)  # SGLang's default max_new_tokens


def test_a_truly_unknown_field_still_warns_once_or_is_refused_under_strict(caplog):
    with caplog.at_level(logging.INFO, logger="http_proc"):
        app = make_app(RecordingClient())
        for _ in range(2):
            assert post_json(app, "/v1/chat/completions", {**ROUTER_CHAT, "frobnicate": 1})[0] == 200
    assert [w for w in warnings_of(caplog) if "frobnicate" in w] == [
        "ignoring unknown request field 'frobnicate' in /v1/chat/completions (sent by a newer client?); "
        "--strict-requests refuses such requests"]
    status, error = post_json(make_app(RecordingClient(), strict=True), "/v1/chat/completions", {**ROUTER_CHAT, "frobnicate": 1})
    assert status == 400 and error["error"]["param"] == "frobnicate"


def test_honoured_sglang_fields_reach_the_server():
    client = RecordingClient()
    app = make_app(client)
    messages = [*MESSAGES, {"role": "assistant", "content": "The answer is"}]
    body = {**ROUTER_CHAT, "messages": messages, "continue_final_message": True, "no_stop_trim": True, "skip_special_tokens": False}
    assert post_json(app, "/v1/chat/completions", body)[0] == 200
    assert post_json(app, "/v1/completions", {**ROUTER_COMPLETION, "stop": ["x"], "no_stop_trim": True, "skip_special_tokens": False})[0] == 200
    sglang = {**ROUTER_GENERATE, "sampling_params": {"max_new_tokens": 4, "stop": ["x"], "no_stop_trim": True, "skip_special_tokens": False}}
    assert post_json(app, "/generate", sglang)[0] == 200
    chat_sent, completion_sent, generate_sent = client.submitted
    assert chat_sent["continue_final_message"] is True and chat_sent["messages"][-1] == messages[-1]
    for sent in client.submitted:
        assert (sent["no_stop_trim"], sent["skip_special_tokens"]) == (True, False)
    assert completion_sent["stop"] == generate_sent["stop"] == ["x"]


def test_the_routers_unknown_model_is_read_as_no_model():
    """The router writes "model": "unknown" into a chat request that names none: this server's model answers."""
    app = make_app(RecordingClient())
    assert post_json(app, "/v1/chat/completions", {**ROUTER_CHAT, "model": "unknown"})[0] == 200
    status, error = post_json(app, "/v1/chat/completions", {**ROUTER_CHAT, "model": "other"})
    assert status == 404 and error["error"]["code"] == "model_not_found"
