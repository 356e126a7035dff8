"""Each structured-output spelling constrains a served tiny model's text: vLLM's structured_outputs and guided_*
on the chat and completions routes, and SGLang's regex / json_schema / ebnf in /generate's sampling_params.
The model is random and sampled at temperature 1: without the grammar its text would not parse."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

import jsonschema
import pytest

from testing.server_process import free_port, start_server

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["color", "size"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{3}-[0-9]{2}"
CHOICES = ["yes", "no", "maybe so"]
GRAMMAR = 'root ::= "up" | "down" | "left" "!"'


@dataclass
class Reply:
    status_code: int
    text: str

    def json(self) -> dict:
        return json.loads(self.text)


@dataclass
class Http:
    port: int

    def post(self, path: str, json: dict) -> Reply:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=_dumps(json),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return Reply(response.status, response.read().decode())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read().decode())


def _dumps(body: dict) -> bytes:
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def http(model_dir):
    port = free_port()
    server = start_server(model_dir, "--http-port", str(port), "--dtype", "float32", "--num-threads", "1",
                          "--kv-cache-tokens", "4096")
    yield Http(port)
    assert server.stop() == 0


def text_of(http, route: str, fields: dict, must_stop: bool = True) -> str:
    body = {"max_tokens": 60, "temperature": 1.0, "seed": 7, **fields}
    if route == "chat":
        reply = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Go:"}], **body})
    else:
        reply = http.post("/v1/completions", json={"prompt": "Go:", **body})
    assert reply.status_code == 200, reply.text
    [choice] = reply.json()["choices"]
    assert choice["finish_reason"] == "stop" or not must_stop, choice
    return choice["message"]["content"] if route == "chat" else choice["text"]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_each_vllm_spelling_constrains_the_text(http, route):
    for fields in ({"structured_outputs": {"json": SCHEMA}}, {"guided_json": SCHEMA}):
        jsonschema.validate(json.loads(text_of(http, route, fields)), SCHEMA)
    # any JSON object: the random model rarely closes one within 60 tokens, but it opens one
    assert text_of(http, route, {"structured_outputs": {"json_object": True}}, must_stop=False).startswith("{")
    for fields in ({"structured_outputs": {"regex": REGEX}}, {"guided_regex": REGEX}):
        assert re.fullmatch(REGEX, text_of(http, route, fields))
    for fields in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
        assert text_of(http, route, fields) in CHOICES
    for fields in ({"structured_outputs": {"grammar": GRAMMAR}}, {"guided_grammar": GRAMMAR}):
        assert text_of(http, route, fields) in ("up", "down", "left!")


def test_sglang_sampling_params_constrain_generate(http):
    def generate(**grammar) -> str:
        body = {"text": "Go:", "sampling_params": {"max_new_tokens": 60, "temperature": 1.0, "sampling_seed": 3, **grammar}}
        reply = http.post("/generate", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["meta_info"]["finish_reason"]["type"] == "stop"
        return reply.json()["text"]

    jsonschema.validate(json.loads(generate(json_schema=json.dumps(SCHEMA))), SCHEMA)
    assert re.fullmatch(REGEX, generate(regex=REGEX))
    assert generate(ebnf=GRAMMAR) in ("up", "down", "left!")


def test_two_spellings_are_refused_naming_both(http):
    reply = http.post("/v1/completions", json={"prompt": "x", "guided_regex": "a", "response_format": {"type": "json_object"}})
    assert reply.status_code == 400 and "guided_regex and response_format" in reply.json()["error"]["message"]
