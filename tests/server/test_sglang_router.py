"""A real zserve server behind a real sglang-router (0.3.2), over loopback: the router registers it (from
/health, /server_info, /model_info), its /v1/models names the model, the openai SDK's chat and completion
requests (streamed and not) and SGLang's /generate succeed through it with the answers the server gives
directly, and the SGLang fields the router forwards (no_stop_trim, skip_special_tokens,
continue_final_message) do what they say. Skipped when sglang_router is not installed."""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request

import openai
import pytest

from testing.server_process import free_port, start_server
from zserve.launcher.fleet.router import RouterProcess, RouterSettings

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                                reason="sglang_router is not installed (pip install sglang-router==0.3.2)")

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REGISTER_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def server(model_dir):
    http_port = free_port()
    handle = start_server(model_dir, "--http-port", str(http_port), "--page-size", "4", "--kv-cache-tokens", "4096",
                          "--num-threads", "1", "--grammar-backend", "none")
    handle.http_port = http_port
    try:
        yield handle
    finally:
        assert handle.stop() == 0, handle.log_tail()


@pytest.fixture(scope="module")
def router(server):
    settings = RouterSettings(host="127.0.0.1", port=free_port(), policy="cache_aware",
                              worker_urls=(f"http://127.0.0.1:{server.http_port}",), prometheus_port=free_port(),
                              log_level="warning", extra_args="")
    proc = RouterProcess.start(settings)
    try:
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while not proc.healthy_urls():
            assert proc.exit_code() is None, f"the router exited with {proc.exit_code()}"
            assert time.monotonic() < deadline, f"the router did not register the server in {REGISTER_TIMEOUT_S:g}s: {proc.workers()}"
            time.sleep(0.1)
        yield proc
    finally:
        proc.stop()


def sdk(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def via_router(router):
    return sdk(router.settings.port)


@pytest.fixture(scope="module")
def direct(server):
    return sdk(server.http_port)


@pytest.fixture(scope="module")
def model_name(direct):
    [model] = direct.models.list().data
    return model.id


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_the_router_registers_the_server_under_its_model_name(router, via_router, model_name):
    assert [m.id for m in via_router.models.list().data] == [model_name]
    [worker] = router.workers()
    assert worker["model_id"] == model_name and worker["metadata"]["served_model_name"] == model_name
    assert (worker["metadata"]["tp_size"], worker["metadata"]["dp_size"]) == ("1", "1")
    with urllib.request.urlopen(f"{router.settings.url}/get_loads", timeout=30) as response:  # asks each worker's /get_load
        [load] = json.loads(response.read())["workers"]
    assert load["load"] >= 0  # -1: the router could not read the worker's answer


@pytest.mark.parametrize("stream", [False, True])
def test_chat_and_completions_through_the_router_answer_as_the_server_does(via_router, direct, model_name, stream):
    def chat(oai) -> str:
        kw = {"model": model_name, "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
        if not stream:
            return oai.chat.completions.create(**kw).choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(**kw, stream=True) if c.choices)

    def complete(oai) -> str:
        kw = {"model": model_name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        if not stream:
            return oai.completions.create(**kw).choices[0].text
        return "".join(c.choices[0].text for c in oai.completions.create(**kw, stream=True) if c.choices)

    assert chat(via_router) == chat(direct) != ""
    assert complete(via_router) == complete(direct) != ""


def test_sglang_generate_and_a_chat_without_a_model_through_the_router(router, server, model_name):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    routed, direct = post(router.settings.port, "/generate", body), post(server.http_port, "/generate", body)
    assert routed["text"] == direct["text"] and routed["meta_info"]["completion_tokens"] == 6
    ids = post(router.settings.port, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert len(ids["output_ids"]) == 3
    chat = post(router.settings.port, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3})  # the router says "unknown"
    assert chat["model"] == model_name and chat["usage"]["completion_tokens"] == 3


def test_no_stop_trim_keeps_the_stop_string(via_router, direct, model_name):
    text = direct.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    stop = next(text[k : k + 2] for k in range(1, len(text) - 1) if text.find(text[k : k + 2]) == k)  # its first occurrence

    def complete(**extra) -> str:
        return via_router.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop],
                                             extra_body=extra).choices[0].text

    end = text.index(stop)
    assert (complete(), complete(no_stop_trim=True)) == (text[:end], text[: end + len(stop)])


def test_skip_special_tokens_false_shows_them(via_router, model_name):
    def complete(**extra) -> str:  # the bias makes every token <|im_start|> (id 1), a special token
        return via_router.completions.create(model=model_name, prompt=PROMPT, max_tokens=3, temperature=0,
                                             extra_body={"logit_bias": {"1": 100}, **extra}).choices[0].text

    assert (complete(), complete(skip_special_tokens=False)) == ("", "<|im_start|>" * 3)


def test_continue_final_message_continues_the_assistants_text(via_router, server, oracle, model_name):
    messages = [*MESSAGES, {"role": "assistant", "content": "The capital is"}]
    continued = oracle.tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=True, return_dict=False)
    expected = post(server.http_port, "/generate", {"input_ids": list(continued), "max_tokens": 5, "temperature": 0,
                                                   "ignore_eos": True})
    answer = via_router.chat.completions.create(model=model_name, messages=messages, max_tokens=5, temperature=0,
                                                extra_body={"continue_final_message": True, "ignore_eos": True})
    assert answer.choices[0].message.content == expected["text"]
    assert answer.usage.prompt_tokens == len(continued)
    closed = via_router.chat.completions.create(model=model_name, messages=messages, max_tokens=1, temperature=0)
    assert closed.usage.prompt_tokens > len(continued)  # without it the turn is closed and a new one opened
