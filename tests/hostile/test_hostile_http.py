"""Hostile requests over HTTP: each is a 4xx with the OpenAI error shape (never a 500) while a
normal request next to it is served with its usual output."""

from __future__ import annotations

import json
import re

import pytest

from testing.hostile import Neighbour, http_post


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


CASES = [
    ("/generate: a key named self", "/generate", body(prompt="hi", self=1), 400, "unknown sampling field.*self"),
    ("/generate: JSON nested 100,000 deep", "/generate", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    ("/generate: a lone surrogate", "/generate", b'{"prompt": "\\ud800 hi"}', 400, "not valid Unicode"),
    ("/generate: top_k=2**31", "/generate", body(prompt="hi", top_k=2**31), 400, "top_k must be an integer in"),
    ("/generate: max_tokens=10**30", "/generate", body(prompt="hi", max_tokens=10**30), 400, "does not fit in 64 bits"),
    ("/generate: input_ids with a float", "/generate", body(input_ids=[5, 1.5]), 400, r"input_ids\[1\] must be an integer"),
    ("/generate: 100,000 stop strings", "/generate", body(prompt="hi", stop=["x"] * 100_000), 400,
     "JSON array .* of more than 65536 entries"),  # refused by the gate's shape scan, before parsing
    ("/generate: 100,001 messages", "/generate", body(messages=[{"role": "user", "content": "a"}] * 100_001), 400,
     "more than 16384 JSON objects"),
    ("/generate: 5,000 messages", "/generate", body(messages=[{"role": "user", "content": "a"}] * 5_000), 400,
     "messages has 5000 entries"),  # under the gate's bounds: the frontend's validator says why
    ("/generate: not JSON", "/generate", b"{nope", 400, "not valid JSON"),
    ("completions: max_tokens=10**30", "/v1/completions", body(prompt="hi", max_tokens=10**30), 400, "does not fit in 64 bits"),
    ("completions: top_k=2**31", "/v1/completions", body(prompt="hi", top_k=2**31), 400, "top_k must be an integer in"),
    ("completions: seed=-1", "/v1/completions", body(prompt="hi", seed=-1), 400, "seed must be an integer in"),
    ("completions: temperature NaN", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400, "temperature must be a finite"),
    ("completions: 10,000 stop strings", "/v1/completions", body(prompt="hi", stop=["x"] * 10_000), 400, "stop has 10000 strings"),
    ("completions: JSON nested 100,000 deep", "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     "invalid request"),
    ("chat: template divides by zero", "/v1/chat/completions", body(messages=[{"role": "user", "content": "zero"}]), 400,
     "ZeroDivisionError"),
    ("chat: template loops forever", "/v1/chat/completions", body(messages=[{"role": "user", "content": "spin"}]), 400,
     "took over 2s to render"),
    ("chat: 100,001 messages", "/v1/chat/completions", body(messages=[{"role": "user", "content": "a"}] * 100_001), 400,
     "more than 16384 JSON objects"),
]


@pytest.mark.parametrize(("name", "path", "data", "status", "needle"), CASES, ids=[c[0] for c in CASES])
def test_hostile_http_request_fails_alone(hostile_server, expected, name, path, data, status, needle):
    neighbour = Neighbour.start(hostile_server.port, expected)
    got_status, reply = http_post(hostile_server.http_port, path, data)
    assert got_status == status, reply
    error = reply["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", reply
    assert re.search(needle, error["message"]), error["message"]
    neighbour.assert_served()


def test_text_plain_post_is_refused(hostile_server, expected):
    neighbour = Neighbour.start(hostile_server.port, expected)
    status, reply = http_post(hostile_server.http_port, "/v1/completions", body(prompt="hi"), content_type="text/plain")
    assert status == 415 and "application/json" in reply["error"]["message"]
    neighbour.assert_served()
