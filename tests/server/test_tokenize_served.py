"""POST /tokenize and /detokenize in vLLM's shapes on a served tiny model, against transformers' tokenizer on the
same directory: a prompt with and without special tokens, messages through the chat template, ids back to text,
and what is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from transformers import AutoTokenizer

from testing.server_process import free_port, start_server

MESSAGES = [{"role": "user", "content": "What is 2 + 2? Ünïcödé ✓"}]


@pytest.fixture(scope="module")
def served(model_dir):
    port = free_port()
    server = start_server(model_dir, "--http-port", str(port), "--num-threads", "1", "--kv-cache-tokens", "1024")
    yield port, AutoTokenizer.from_pretrained(model_dir)
    assert server.stop() == 0


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_tokenize_a_prompt_as_transformers_does(served):
    port, tokenizer = served
    prompt = "Hello world, Ünïcödé ✓ 123"
    for add_special in (True, False):
        status, body = post(port, "/tokenize", {"prompt": prompt, "add_special_tokens": add_special})
        expected = tokenizer.encode(prompt, add_special_tokens=add_special)
        assert status == 200 and body["tokens"] == expected and body["count"] == len(expected), body
        assert body["max_model_len"] > 0 and body["token_strs"] is None
    assert post(port, "/tokenize", {"prompt": prompt})[1]["tokens"] == tokenizer.encode(prompt)  # vLLM's default


def test_tokenize_messages_through_the_chat_template(served):
    port, tokenizer = served
    status, body = post(port, "/tokenize", {"messages": MESSAGES})
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert status == 200 and body["tokens"] == tokenizer.encode(rendered, add_special_tokens=False), body


def test_detokenize_is_the_text_of_the_ids(served):
    port, tokenizer = served
    ids = tokenizer.encode("round trip: Ünïcödé ✓", add_special_tokens=False)
    status, body = post(port, "/detokenize", {"tokens": ids})
    assert (status, body) == (200, {"prompt": tokenizer.decode(ids)})


def test_vllm_s_tokenize_options_are_honoured(served):
    """return_token_strs gives each id's vocabulary string; add_generation_prompt false and a request's own
    chat_template render the messages as transformers does with the same options."""
    port, tokenizer = served
    status, body = post(port, "/tokenize", {"prompt": "round trip", "return_token_strs": True})
    assert status == 200 and body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"]), body
    status, body = post(port, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert status == 200 and body["tokens"] == tokenizer.encode(rendered, add_special_tokens=False), body
    own = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    status, body = post(port, "/tokenize", {"messages": MESSAGES, "chat_template": own})
    rendered = tokenizer.apply_chat_template(MESSAGES, chat_template=own, add_generation_prompt=True, tokenize=False)
    assert status == 200 and body["tokens"] == tokenizer.encode(rendered, add_special_tokens=False), body


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"messages": MESSAGES, "add_special_tokens": True}, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "add_generation_prompt": False}, "add_generation_prompt"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "prompt"),
    ("/detokenize", {"tokens": [10**9]}, None),
    ("/tokenize", {"prompt": "x", "model": "not-this-one"}, "model"),
])
def test_what_is_not_done_is_refused(served, path, body, param):
    status, error = post(served[0], path, body)
    assert status in (400, 404) and error["error"]["param"] == param, error
