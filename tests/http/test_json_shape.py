"""JsonShape (http_proc/shared/json_shape.py) and the request gate's shape check: a body with a longer
array or more objects than any valid request is refused before anything parses it."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.http.test_request_gate import JSON, error_of, policy, run_gate
from zserve.http_proc.shared.json_shape import JsonShape
from zserve.http_proc.shared.request_gate import MAX_JSON_OBJECTS, MIN_JSON_RUN, SCAN_MIN_BYTES


def shape_of(body: bytes, slice_bytes: int) -> JsonShape:
    return asyncio.run(JsonShape.of(body, 1 << 40, 1 << 40, slice_bytes=slice_bytes))


@pytest.mark.parametrize("slice_bytes", [1, 3, 7, 64, 1 << 20])
def test_counts_ignore_strings_and_escapes_wherever_slices_end(slice_bytes):
    body = json.dumps({
        "prompt": list(range(40)),  # the longest run: 39 commas
        "messages": [{"role": "user", "content": 'a, [b] {c}, \\ " ,,,,'}] * 5,  # commas, brackets, escapes in strings
        "stop": ["\\", '"', "\\\\\"{,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,}"],
    }).encode()
    shape = shape_of(body, slice_bytes)
    assert (shape.longest_run, shape.num_objects) == (39, 6)


def test_a_long_flat_array_and_many_objects_are_seen():
    assert shape_of(json.dumps({"input_ids": [1] * 100_000}).encode(), 4096).longest_run == 99_999
    assert shape_of(json.dumps({"messages": [{"role": "user", "content": "x"}] * 1000}).encode(), 4096).num_objects == 1001


def test_gate_refuses_an_oversized_shape_before_the_app_sees_it():
    gate = policy(max_request_bytes=16 << 20, context_len=512)
    status, _, body, seen = run_gate(gate, "POST", "/v1/completions", JSON, [json.dumps({"prompt": [5] * 1_000_000}).encode()])
    assert status == 400 and seen == [] and error_of(body)["code"] == "request_too_large"
    assert f"more than {MIN_JSON_RUN} entries" in error_of(body)["message"]
    chat = json.dumps({"messages": [{"role": "user", "content": "a"}] * 100_000}).encode()
    status, _, body, seen = run_gate(gate, "POST", "/v1/chat/completions", JSON, [chat])
    assert status == 400 and seen == [] and f"more than {MAX_JSON_OBJECTS} JSON objects" in error_of(body)["message"]


def test_gate_passes_valid_large_bodies_whole():
    gate = policy(max_request_bytes=16 << 20, context_len=100_000)  # a long context: a prompt may hold 99,999 ids
    prompt_ids = json.dumps({"prompt": [5] * 99_999}).encode()
    long_text = json.dumps({"prompt": "word, " * 100_000}).encode()  # commas in a string are no entries
    for body in (prompt_ids, long_text):
        assert len(body) > SCAN_MIN_BYTES
        status, _, _, seen = run_gate(gate, "POST", "/v1/completions", JSON, [body[: len(body) // 2], body[len(body) // 2 :]])
        assert status == 200 and seen == [body]
