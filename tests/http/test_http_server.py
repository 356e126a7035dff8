"""The HTTP front end end to end: a real launch_server with --http-port on the tiny random Llama,
driven by the official `openai` package (unmodified) and by raw HTTP.

One server for the module (starting one costs seconds); the last test stops it.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing.peer_metrics import peer_mismatches, scrape_samples
from testing.server_process import ServerProcess, free_port, start_server
from testing.server_process import wait_idle as harness_wait_idle
from zserve.client import Client

PROMPT = "The quick brown fox jumps over the lazy dog and then"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
WATCHDOG_S = 10  # short, for the health test; a step of the tiny model takes milliseconds



@pytest.fixture(scope="module")
def server(model_dir):
    http_port = free_port()
    handle = start_server(
        model_dir, "--http-port", str(http_port), "--page-size", "4", "--kv-cache-tokens", "8192",
        "--max-running-requests", "2", "--max-queued-requests", "4", "--num-threads", "1",
        "--watchdog-timeout", str(WATCHDOG_S),
    )
    handle.http_port = http_port
    assert f"HTTP on http://127.0.0.1:{http_port}" in handle.log()
    yield handle
    assert handle.stop() == 0, handle.log()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_name(oai):
    [model] = oai.models.list().data
    return model.id


def wait_idle(port: int, timeout_s: float = 15.0) -> dict:
    with Client(port) as c:
        return harness_wait_idle(c, timeout_s)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post_raw(port: int, path: str, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    status, data = response.status, json.loads(response.read())
    conn.close()
    return status, data


def metric_samples(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics by (name, labels but model_name), after checking each carries
    model_name and that there are no `_created` series."""
    status, text = http_get(port, "/metrics")
    assert status == 200 and "_created" not in text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("model_name", None), f"{sample.name} has no model_name label"
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


# ---- the OpenAI SDK ----------------------------------------------------------------------------


def test_models_lists_the_model_directory(oai, model_dir, model_name):
    assert model_name == model_dir.name


def test_completion_greedy_matches_the_zmq_client(server, oai, model_name):
    with Client(server.port, timeout_s=60) as c:
        expected = c.generate(PROMPT, max_tokens=20, temperature=0.0, ignore_eos=True)
    r = oai.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == model_name
    assert r.choices[0].text == expected.text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == expected.usage.prompt_tokens
    assert r.usage.completion_tokens == 20 and r.usage.total_tokens == expected.usage.prompt_tokens + 20

    stream = oai.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_greedy_matches_the_zmq_client(server, oai, model_name):
    with Client(server.port, timeout_s=60) as c:
        expected = c.generate(messages=MESSAGES, max_tokens=16, temperature=0.0)
    r = oai.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == expected.text
    assert r.choices[0].finish_reason == expected.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (expected.usage.prompt_tokens, expected.usage.completion_tokens)

    chunks = list(oai.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=16, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_finish_reason_stop_for_stop_strings_and_stop_token_ids(server, oai, model_name):
    with Client(server.port, timeout_s=60) as c:
        full = c.generate(PROMPT, max_tokens=30, temperature=0.0, ignore_eos=True)
        stop = full.text[6:9]
        by_string = c.generate(PROMPT, max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop])
        by_id = c.generate(PROMPT, max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[full.output_ids[4]])
    r = oai.completions.create(model=model_name, prompt=PROMPT, max_tokens=30, temperature=0, stop=stop, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == by_string.text == full.text[: full.text.index(stop)]
    assert r.usage.completion_tokens == by_string.usage.completion_tokens < 30
    r = oai.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=30, temperature=0, extra_body={"ignore_eos": True, "stop_token_ids": [full.output_ids[4]]},
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == by_id.text
    assert r.usage.completion_tokens == by_id.usage.completion_tokens <= 5


def test_token_id_prompt_and_cached_tokens(server, oai, model_name):
    ids = list(range(40, 80))
    with Client(server.port, timeout_s=60) as c:
        expected = c.generate(input_ids=ids, max_tokens=8, temperature=0.0, ignore_eos=True)
    r = oai.completions.create(model=model_name, prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].text == expected.text
    assert r.usage.prompt_tokens == 40
    assert r.usage.prompt_tokens_details.cached_tokens > 0  # the ZMQ request above left the prefix in the cache


def test_n_choices_sampled_with_seeds_and_usage_summed(oai, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=11, extra_body={"ignore_eos": True})
    r = oai.completions.create(**kwargs)
    again = oai.completions.create(**kwargs)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [c.text for c in again.choices]  # seed + i per choice: reproducible
    assert len({c.text for c in r.choices}) > 1  # and the choices differ
    assert r.usage.completion_tokens == 24
    chunks = list(oai.completions.create(**kwargs, stream=True))
    by_choice = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)}
    assert by_choice == {c.index: c.text for c in r.choices}


# ---- errors ------------------------------------------------------------------------------------

BAD = [
    (dict(prompt=""), "empty"),
    (dict(prompt="hi " * 600), "context"),
    (dict(prompt="hi", temperature=-1), "temperature"),
    (dict(prompt="hi", top_p=0), "top_p"),
    (dict(prompt="hi", extra_body={"min_p": 2.0}), "min_p"),
    (dict(prompt="hi", logprobs=21), "logprobs"),
    (dict(prompt="hi", n=1000), "choices"),
    (dict(prompt=[10**6]), "token"),
]


@pytest.mark.parametrize(("kwargs", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_requests_are_400_with_the_reason(oai, model_name, kwargs, needle):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match=needle) as info:
            oai.completions.create(model=model_name, max_tokens=4, stream=stream, **kwargs)
        assert info.value.status_code == 400
        assert info.value.body["type"] == "invalid_request_error"


def test_max_tokens_beyond_the_context_is_a_400_naming_both_and_a_chat_without_one_runs_to_the_context(oai, model_name):
    messages = [{"role": "user", "content": "hi " * 100}]
    needle = r"maximum context length is 512 tokens\. However, you requested \d+ tokens \(\d+ in the messages, 600 in the completion\)"
    with pytest.raises(openai.BadRequestError, match=needle) as info:
        oai.chat.completions.create(model=model_name, messages=messages, max_tokens=600)
    assert info.value.status_code == 400
    r = oai.chat.completions.create(model=model_name, messages=messages, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens + r.usage.completion_tokens == 512


def test_unknown_model_is_404_and_bad_json_is_400(server, oai):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    status, body = post_raw(server.http_port, "/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = post_raw(server.http_port, "/generate", b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, _ = http_get(server.http_port, "/v1/nothing")
    assert status == 404


def test_unknown_fields_are_ignored_and_logged_once_per_name(server, oai, model_name):
    """As vLLM: a field a newer SDK sends is no 400; the log names it once, not once per request."""
    for stream in (False, True):
        r = oai.completions.create(model=model_name, prompt=PROMPT, max_tokens=3, stream=stream,
                                   extra_body={"frobnicate": 1, "ignore_eos": True})
        assert len(list(r) if stream else r.choices[0].text) > 0
        r = oai.chat.completions.create(model=model_name, max_tokens=3, messages=[{**MESSAGES[0], "reasoning_content": "x"}],
                                        extra_body={"frobnicate": 1})
        assert r.choices[0].finish_reason in ("stop", "length")
    log = server.log()
    assert log.count("ignoring unknown request field 'frobnicate' in /v1/completions") == 1, log
    assert log.count("ignoring unknown request field 'frobnicate' in ") == 1  # one per name, whichever route
    assert log.count("ignoring unknown request field 'messages.reasoning_content' in /v1/chat/completions") == 1
    with pytest.raises(openai.BadRequestError, match=r"temperature") as info:  # known fields stay strict
        oai.completions.create(model=model_name, prompt=PROMPT, temperature="hot", extra_body={"frobnicate": 1})
    assert info.value.status_code == 400


def test_malformed_tools_are_a_400_naming_the_field(server, oai, model_name):
    for tools, path in [([{"type": "function"}], "tools[0].function"), ([{"type": "function", "function": {"description": "x"}}],
                        "tools[0].function.name"), ([{"type": "function", "function": {"name": "f", "parameters": 1}}],
                        "tools[0].function.parameters")]:
        with pytest.raises(openai.BadRequestError, match=re.escape(path)) as info:
            oai.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, tools=tools)
        assert info.value.status_code == 400 and info.value.body["param"] == path


def test_strict_requests_refuses_unknown_fields_with_a_400(model_dir):
    http_port = free_port()
    strict = start_server(model_dir, "--http-port", str(http_port), "--num-threads", "1", "--kv-cache-tokens", "2048",
                          "--strict-requests")
    try:
        oai = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="frobnicate: Extra inputs are not permitted") as info:
            oai.completions.create(model=model_dir.name, prompt=PROMPT, max_tokens=3, extra_body={"frobnicate": 1})
        assert info.value.body["param"] == "frobnicate"
        with pytest.raises(openai.BadRequestError, match=re.escape("messages[0].reasoning_content")):
            oai.chat.completions.create(model=model_dir.name, max_tokens=3, messages=[{**MESSAGES[0], "reasoning_content": "x"}])
        assert oai.completions.create(model=model_dir.name, prompt=PROMPT, max_tokens=3).choices[0].text is not None
    finally:
        assert strict.stop() == 0


STREAM_SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "integer", "minimum": 1, "maximum": 9},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
    "required": ["color", "size", "tags"],
    "additionalProperties": False,
}


def test_streamed_structured_output_joins_into_valid_json(oai, model_name):
    """Streaming an answer under response_format json_schema: the deltas, joined, are the JSON the
    grammar asked for (valid against the schema), and the last choice chunk carries the
    finish_reason. (json_object is not bounded: a random model need not close it in max_tokens.)"""
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "thing", "schema": STREAM_SCHEMA, "strict": True}}
    for seed in range(3):
        chunks = list(oai.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "A thing, as JSON."}], max_tokens=120, temperature=1.0,
            seed=seed, stream=True, response_format=response_format))
        choice_chunks = [c for c in chunks if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in choice_chunks)
        assert sum(1 for c in choice_chunks if c.choices[0].delta.content) > 1  # it streamed, not one chunk at the end
        assert [c.choices[0].finish_reason for c in choice_chunks[:-1]] == [None] * (len(choice_chunks) - 1)
        assert choice_chunks[-1].choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), STREAM_SCHEMA)


def test_full_queue_is_503(server, oai, model_name):
    outcomes: list[str] = []

    def one() -> None:
        try:
            oai.completions.create(model=model_name, prompt=PROMPT, max_tokens=48, extra_body={"ignore_eos": True})
            outcomes.append("ok")
        except openai.APIStatusError as exc:
            outcomes.append(f"{exc.status_code} {exc.body['message']}")

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert "ok" in outcomes, outcomes
    busy = [o for o in outcomes if o != "ok"]
    assert busy and all(o.startswith("503 server busy") for o in busy), outcomes
    wait_idle(server.port)


# ---- native /generate ---------------------------------------------------------------------------


def test_generate_returns_token_ids_like_the_python_client(server):
    with Client(server.port, timeout_s=60) as c:
        expected = c.generate(PROMPT, max_tokens=10, ignore_eos=True, return_logprob=True)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "return_logprob": True}).encode()
    status, r = post_raw(server.http_port, "/generate", body)
    assert status == 200
    assert r["output_ids"] == expected.output_ids and r["text"] == expected.text and r["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 10 and len(r["logprobs"]) == 10

    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/generate", body=json.dumps({"input_ids": expected.output_ids[:3], "max_tokens": 5, "stream": True}), headers={"Content-Type": "application/json"})
    lines = [line for line in conn.getresponse().read().decode().split("\n\n") if line]
    conn.close()
    assert lines[-1] == "data: [DONE]"
    outputs = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert outputs[-1]["finish_reason"] is not None and all(o["finish_reason"] is None for o in outputs[:-1])
    assert sum(len(o["output_ids"]) for o in outputs) == outputs[-1]["usage"]["completion_tokens"]
    status, r = post_raw(server.http_port, "/generate", json.dumps({"prompt": "hi", "bogus": 1}).encode())
    assert status == 400 and "bogus" in r["error"]["message"]


def test_generate_reads_and_answers_sglangs_shape(server):
    """An SGLang client's /generate: text + sampling_params (max_new_tokens, top_k -1, ...) in, text + output_ids
    + meta_info out; streamed, each chunk holds the text so far; SGLang's fields that change nothing here are accepted."""
    with Client(server.port, timeout_s=60) as c:
        expected = c.generate(PROMPT, max_tokens=6, ignore_eos=True, return_logprob=True)
    body = {"text": PROMPT, "rid": "abc", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "top_k": -1, "ignore_eos": True, "skip_special_tokens": True}}
    status, r = post_raw(server.http_port, "/generate", json.dumps(body).encode())
    assert status == 200, r
    assert r["text"] == expected.text and r["output_ids"] == expected.output_ids
    meta = r["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (expected.usage.prompt_tokens, 6)
    assert meta["e2e_latency"] > 0  # seconds, once finished
    assert [t[1] for t in meta["output_token_logprobs"]] == expected.output_ids
    assert "accepting SGLang request field 'rid' in /generate; it has no effect in zserve" in server.log()  # INFO, not a warning

    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/generate", body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"})
    lines = [line for line in conn.getresponse().read().decode().split("\n\n") if line]
    conn.close()
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False)) and texts[-1] == expected.text
    assert chunks[-1]["output_ids"] == expected.output_ids and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None and "e2e_latency" not in c["meta_info"] for c in chunks[:-1])

    batch = {"text": ["a", PROMPT, "b"], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    status, r = post_raw(server.http_port, "/generate", json.dumps(batch).encode())  # SGLang's batch: a list back
    assert status == 200 and [len(x["output_ids"]) for x in r] == [6, 6, 6] and r[1]["text"] == expected.text, r
    status, r = post_raw(server.http_port, "/generate", json.dumps({**batch, "stream": True}).encode())
    assert status == 400 and "cannot stream" in r["error"]["message"]
    status, r = post_raw(server.http_port, "/generate", json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode())
    assert status == 200 and r["meta_info"]["completion_tokens"] <= 2


def test_http_client_helper_matches_the_zmq_client(server):
    """testing.http_client.HttpClient: the AsyncClient interface over HTTP, for benchmarks."""
    import asyncio

    from testing.http_client import HttpClient
    from zserve.client import AsyncClient

    async def both():
        async with AsyncClient(server.port) as zc, HttpClient(f"http://127.0.0.1:{server.http_port}") as hc:
            kwargs = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
            pairs = [pair async for pair in hc.stream_outputs(PROMPT, **kwargs)]
            return await zc.generate(PROMPT, **kwargs), pairs, await hc.generate(messages=MESSAGES, max_tokens=3), await hc.stats()

    expected, pairs, chat, stats = asyncio.run(both())
    final = pairs[-1][1]
    assert "".join(d for d, _ in pairs) == final.text == expected.text
    assert final.finish_reason == "length" and final.usage.completion_tokens == 12
    assert final.usage.prompt_tokens == expected.usage.prompt_tokens and final.ttft_s is not None
    assert chat.usage.completion_tokens <= 3 and chat.finish_reason in ("stop", "length")
    assert {"num_running", "num_waiting", "num_free_pages", "num_generated_tokens", "num_aborted"} <= set(stats)


# ---- disconnects, health, metrics ---------------------------------------------------------------


def open_request(port: int, path: str, body: dict) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def disconnect(conn: http.client.HTTPConnection) -> None:
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_client_disconnect_aborts_the_request(server, model_name, stream):
    before = wait_idle(server.port)
    aborted_before = metric_samples(server.http_port).get(("zserve_requests_aborted_total", (("cause", "client_disconnect"),)), 0)
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 400, "stream": stream, "ignore_eos": True}
    conn = open_request(server.http_port, "/v1/completions", body)
    if stream:
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
    else:
        with Client(server.port) as c:
            while c.stats()["num_running"] == 0:
                time.sleep(0.02)
    disconnect(conn)
    after = wait_idle(server.port, timeout_s=5)  # far less than 400 tokens take
    assert after["num_aborted"] == before["num_aborted"] + 1
    assert after["num_generated_tokens"] - before["num_generated_tokens"] < 400
    assert after["num_used_pages"] == 0, after
    aborted_after = metric_samples(server.http_port)[("zserve_requests_aborted_total", (("cause", "client_disconnect"),))]
    assert aborted_after == aborted_before + 1


def test_metrics_parse_and_counters_move(server, oai, model_name):
    wait_idle(server.port)
    before = metric_samples(server.http_port)
    r = oai.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    after = metric_samples(server.http_port)

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert moved("zserve_generation_tokens_total") == r.usage.completion_tokens == 6
    assert moved("zserve_prompt_tokens_total") == r.usage.prompt_tokens
    assert moved("zserve_requests_finished_total") == 1
    for name in ("zserve_time_to_first_token_seconds_count", "zserve_e2e_request_latency_seconds_count"):
        assert moved(name) == 1
    assert moved("zserve_inter_token_latency_seconds_count") >= 1
    assert moved("zserve_http_responses_total", route="/v1/chat/completions", status="200") == 1
    assert after[("zserve_num_requests_running", ())] == 0 and after[("zserve_kv_pages_used", ())] == 0
    assert after[("zserve_kv_pages_free", ())] > 0 and 0 <= after[("zserve_prefix_cache_hit_rate", ())] <= 1
    for name in ("zserve_num_requests_waiting", "zserve_kv_pages_cached", "zserve_scheduler_requests_aborted_total",
                 "zserve_requests_failed_total"):
        assert any(key[0] == name for key in after), name


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_x_request_id_and_openai_id_name_the_requests_log_lines(server, model_name, stream):
    conn = open_request(server.http_port, "/v1/completions", {"model": model_name, "prompt": PROMPT, "max_tokens": 3, "stream": stream})
    response = conn.getresponse()
    request_id = response.getheader("X-Request-Id")
    body = response.read().decode()
    conn.close()
    assert response.status == 200 and request_id and request_id.isdigit(), body
    assert f'"id":"cmpl-{request_id}"' in body.replace(" ", "")
    deadline = time.monotonic() + 5
    while f"req {request_id} finished (length)" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"req {request_id} admitted" in server.log() and f"req {request_id} finished (length)" in server.log()


def test_n_4_returns_4_choices_and_seeded_choices_reproduce(server, oai, model_name):
    """(This server has 2 request rows: the other 2 choices wait and hit the prefix cache; with
    rows for all, the prompt is prefilled once: tests/server/test_server_n_choices.py.)"""
    prompt = "A prompt nobody sent before, for the n=4 test: " + "the quick brown fox " * 4
    first = oai.completions.create(model=model_name, prompt=prompt, max_tokens=6, n=4, temperature=1.0, seed=11)
    assert [ch.index for ch in first.choices] == [0, 1, 2, 3]
    assert len({ch.text for ch in first.choices}) > 1  # each choice draws from its own seed (seed + i)
    again = oai.completions.create(model=model_name, prompt=prompt, max_tokens=6, n=4, temperature=1.0, seed=11)
    assert [ch.text for ch in again.choices] == [ch.text for ch in first.choices]


def test_zmq_client_requests_move_the_latency_histograms(server):
    """/metrics counts every door: a request through the Python client moves TTFT, E2E, queue time
    and the length histograms, and the outcome counter."""
    wait_idle(server.port)
    before = metric_samples(server.http_port)
    with Client(server.port) as c:
        result = c.generate(PROMPT, max_tokens=5, ignore_eos=True)
    after = metric_samples(server.http_port)

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
                 "request_prompt_tokens", "request_generation_tokens"):
        assert moved(f"zserve_{name}_count") == 1, name
    assert moved("zserve_request_generation_tokens_sum") == 5
    assert moved("zserve_request_prompt_tokens_sum") == result.usage.prompt_tokens
    assert moved("zserve_request_outcomes_total", finish_reason="length") == 1
    assert 0 <= after[("zserve_kv_cache_usage_ratio", ())] <= 1


def test_peer_metric_names_show_the_zserve_values(server, oai, model_name):
    """vLLM's and SGLang's dashboards read /metrics under their names: after requests through two doors, each `vllm:`
    and `sglang:` family equals its zserve_* source in the same scrape (counters, gauges, histogram buckets, counts
    and sums), labelled model_name (and vLLM's engine)."""
    wait_idle(server.port)
    before = scrape_samples(http_get(server.http_port, "/metrics")[1])
    r = oai.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    with Client(server.port) as c:
        result = c.generate(PROMPT, max_tokens=4, ignore_eos=True)
    status, text = http_get(server.http_port, "/metrics")
    assert status == 200 and peer_mismatches(text) == []
    after = scrape_samples(text)
    vllm, sglang = (("engine", "0"), ("model_name", model_name)), (("model_name", model_name),)

    def moved(name: str, labels: tuple) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert moved("vllm:generation_tokens_total", vllm) == moved("sglang:generation_tokens_total", sglang) == 9
    num_prompt_tokens = r.usage.prompt_tokens + result.usage.prompt_tokens
    assert moved("vllm:prompt_tokens_total", vllm) == moved("sglang:prompt_tokens_total", sglang) == num_prompt_tokens
    assert moved("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"), ("model_name", model_name))) == 2
    for name in ("time_to_first_token_seconds_count", "e2e_request_latency_seconds_count"):
        assert moved(f"vllm:{name}", vllm) == moved(f"sglang:{name}", sglang) == 2
    assert moved("vllm:inter_token_latency_seconds_count", vllm) >= 2
    assert after[("vllm:num_requests_running", vllm)] == after[("sglang:num_running_reqs", sglang)] == 0
    assert 0 <= after[("vllm:kv_cache_usage_perc", vllm)] == after[("sglang:token_usage", sglang)] <= 1


def wait_health(port: int, status: int, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        got, body = http_get(port, "/health")
        if got == status or time.monotonic() > deadline:
            assert got == status, body
            return json.loads(body)
        time.sleep(0.1)


def test_health_stays_200_through_a_long_step_and_turns_503_stalled_past_the_watchdog(server):
    """A stopped model worker is a model step that does not end: the scheduler answers no stats
    meanwhile. /health stays 200 past the old 5 s answer threshold (a long step is no outage),
    then turns 503 stalled once --watchdog-timeout passes, and 200 again when the step ends."""
    assert wait_health(server.http_port, 200)["status"] == "ready"
    model_pid = server.child_pid("model_proc")
    os_kill = __import__("os").kill
    os_kill(model_pid, signal.SIGSTOP)
    try:
        with Client(server.port) as c:
            c.submit(PROMPT, max_tokens=4)  # the scheduler now waits on the stopped worker
            stopped_s = time.monotonic()
            while time.monotonic() - stopped_s < WATCHDOG_S - 3:
                status, body = http_get(server.http_port, "/health")
                assert status == 200, body
                time.sleep(0.2)
            body = wait_health(server.http_port, 503, timeout_s=10.0)
            assert body["status"] == "stalled" and "--watchdog-timeout 10s" in body["detail"], body
    finally:
        os_kill(model_pid, signal.SIGCONT)
    wait_health(server.http_port, 200)


def test_100_health_probes_on_an_idle_server_create_no_request_log_line_or_metric_change(server):
    wait_idle(server.port)
    wait_health(server.http_port, 200)
    before_metrics = metric_samples(server.http_port)
    num_log_lines = len(server.log_lines)
    with Client(server.port) as c:
        steps_before = c.stats()["num_steps"]
        for _ in range(100):
            started_s = time.monotonic()
            status, _ = http_get(server.http_port, "/health")
            assert status == 200 and time.monotonic() - started_s < 0.5
        assert c.stats()["num_steps"] == steps_before  # no request ran
    time.sleep(0.3)
    assert server.log_lines[num_log_lines:] == []
    assert metric_samples(server.http_port) == before_metrics


def test_health_generate_runs_one_token_and_counts_as_no_traffic(server):
    wait_idle(server.port)
    before = metric_samples(server.http_port)
    status, body = http_get(server.http_port, "/health_generate")
    assert status == 200 and json.loads(body)["status"] == "ok", body
    after = metric_samples(server.http_port)
    for name in ("zserve_time_to_first_token_seconds_count", "zserve_e2e_request_latency_seconds_count"):
        assert after[(name, ())] == before[(name, ())]


def test_shutdown_drains_in_flight_requests_and_refuses_new_ones_with_503(server, oai, model_name):
    """Last in the module: it stops the server. SIGTERM drains: the HTTP requests in flight finish
    with all their tokens, a new one gets 503 server_draining, /health turns 503 draining. Three
    long requests on two running rows (one waits its turn in the scheduler) keep the drain going
    while the checks run: one alone finished within them once bf16 on AVX2 made steps faster."""
    outcome: list[BaseException | object] = []

    def long_request() -> None:
        try:
            outcome.append(oai.completions.create(model=model_name, prompt=PROMPT, max_tokens=400, extra_body={"ignore_eos": True}))
        except BaseException as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    for thread in threads:
        thread.start()
    with Client(server.port) as c:
        while (stats := c.stats())["num_running"] < 2 or stats["num_waiting"] < 1:
            time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIStatusError) as info:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # sent before the frontend heard of the drain: served; try again
            oai.completions.create(model=model_name, prompt="too late", max_tokens=2)
    assert info.value.status_code == 503 and info.value.body["code"] == "server_draining", info.value.body
    assert wait_health(server.http_port, 503)["status"] == "draining"
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcome) == 3
    for completion in outcome:
        assert not isinstance(completion, BaseException), completion
        assert completion.usage.completion_tokens == 400 and completion.choices[0].finish_reason == "length"
    assert server.proc.wait(timeout=20) == 0


def test_health_answers_503_starting_at_once_during_startup(model_dir):
    """The HTTP process starts with the others (the client port is fixed), so /health answers
    from the first moment: 503 "starting", each within 0.1 s, until the server is ready."""
    http_port = free_port()
    pending = ServerProcess.spawn(model_dir, ["--http-port", str(http_port), "--kv-cache-tokens", "2048", "--num-threads", "1"])
    statuses: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            try:
                conn.connect()
            except OSError:  # not listening yet
                time.sleep(0.01)
                continue
            # timed from the open connection: a SYN the kernel dropped while the socket came up is
            # retried after 1 s, which is not the server's answer time
            started_s = time.monotonic()
            conn.request("GET", "/health")
            response = conn.getresponse()
            status, body = response.status, response.read().decode()
            conn.close()
            assert time.monotonic() - started_s < 0.1, "a /health answer took 0.1 s or more"
            statuses.append((status, json.loads(body)["status"]))
            if status == 200:
                break
            time.sleep(0.01)
        server = pending.wait_ready(60)
        assert statuses and statuses[0] == (503, "starting"), statuses[:3]
        assert statuses[-1] == (200, "ready")
        assert server.stop() == 0
    finally:
        pending.kill()
