"""The native API's default of 128 new tokens (SGLang's max_new_tokens default): a request without
max_tokens from Client, AsyncClient, the chat shell or POST /generate stops at 128 with finish
reason "length" when the model does not stop first; an explicit None ("max_tokens": null, the
shell's `--max-tokens none`) runs to the context. The OpenAI routes keep OpenAI's meaning."""

from __future__ import annotations

import asyncio
import builtins
import http.client
import json

import pytest

from testing.server_process import free_port, start_server
from zserve.client import AsyncClient, Client
from zserve.client.chat_shell import main as chat_shell_main
from zserve.common.sampling_params import DEFAULT_MAX_TOKENS

CONTEXT_LEN = 512  # the tiny model's
PROMPT_IDS = [11, 12, 13, 14]


@pytest.fixture(scope="module")
def server(model_dir):
    http_port = free_port()
    handle = start_server(
        model_dir, "--http-port", str(http_port), "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096",
    )
    handle.http_port = http_port
    yield handle
    assert handle.stop() == 0, handle.log_tail()


def post_generate(port: int, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    assert response.status == 200, data
    return data


def test_the_default_is_sglangs():
    assert DEFAULT_MAX_TOKENS == 128


def test_client_without_max_tokens_stops_at_128_and_none_runs_to_the_context(server):
    with Client(server.port, timeout_s=120) as c:
        result = c.generate(input_ids=PROMPT_IDS, ignore_eos=True)
        assert result.finish_reason == "length" and len(result.output_ids) == DEFAULT_MAX_TOKENS
        assert "".join(c.stream(input_ids=PROMPT_IDS, ignore_eos=True)) == result.text
        [batched] = c.generate_batch(["Once upon a time"], ignore_eos=True)
        assert len(batched.output_ids) == DEFAULT_MAX_TOKENS
        unbounded = c.generate(input_ids=PROMPT_IDS, ignore_eos=True, max_tokens=None)
        assert unbounded.finish_reason == "length" and len(unbounded.output_ids) == CONTEXT_LEN - len(PROMPT_IDS)


def test_async_client_without_max_tokens_stops_at_128(server):
    async def run() -> tuple:
        async with AsyncClient(server.address, timeout_s=120) as c:
            result = await c.generate(input_ids=PROMPT_IDS, ignore_eos=True)
            deltas = [d async for d in c.stream(input_ids=PROMPT_IDS, ignore_eos=True)]
            return result, "".join(deltas)

    result, streamed = asyncio.run(run())
    assert result.finish_reason == "length" and len(result.output_ids) == DEFAULT_MAX_TOKENS
    assert streamed == result.text


def test_native_generate_route_without_max_tokens_stops_at_128_and_null_runs_to_the_context(server):
    r = post_generate(server.http_port, {"input_ids": PROMPT_IDS, "ignore_eos": True})
    assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
    r = post_generate(server.http_port, {"input_ids": PROMPT_IDS, "ignore_eos": True, "max_tokens": None})
    assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == CONTEXT_LEN - len(PROMPT_IDS)


def test_openai_chat_without_max_tokens_still_runs_to_the_context(server):
    body = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, "temperature": 0}
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    conn.request("GET", "/v1/models")
    body["model"] = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    usage = json.loads(conn.getresponse().read())["usage"]
    conn.close()
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT_LEN


def long_answer_question(client: Client) -> str:
    """A question whose greedy chat answer has no EOS in its first 200 tokens (the shell sends no ignore_eos)."""
    for i in range(20):
        question = f"Tell me a long story, number {i}."
        if client.generate(messages=[{"role": "user", "content": question}], max_tokens=200).finish_reason == "length":
            return question
    pytest.skip("no question among 20 has a greedy answer without EOS on this random model")


@pytest.mark.parametrize("max_tokens_args", [[], ["--max-tokens", "none"]])
def test_chat_shell_answers_at_most_128_tokens_unless_told_none(server, monkeypatch, capsys, max_tokens_args):
    with Client(server.port, timeout_s=120) as c:
        question = long_answer_question(c)
        messages = [{"role": "user", "content": question}]
        expected = c.generate(messages=messages, max_tokens=None if max_tokens_args else DEFAULT_MAX_TOKENS)
    if max_tokens_args:
        assert len(expected.output_ids) > 200  # no EOS among the first 200
    else:
        assert expected.finish_reason == "length" and len(expected.output_ids) == DEFAULT_MAX_TOKENS
    lines = iter([question])

    def fake_input(prompt: str = "") -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", fake_input)
    capsys.readouterr()
    chat_shell_main(["--zmq-port", str(server.port), *max_tokens_args])
    out = capsys.readouterr().out
    assert out.endswith("\n" + expected.text + "\n\n"), out[-300:]  # the answer, its newline, then Ctrl-D's
