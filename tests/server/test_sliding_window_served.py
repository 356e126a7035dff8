"""Sliding-window attention served end to end: a tiny Qwen2 with `use_sliding_window` (layer 0
global, layers 1 and 2 a window of 8 tokens) behind launch_server, on its default attention path.
Prompts several windows long in chunks of 16 tokens (two windows), a batch of mixed lengths, a
shared prefix served from the radix cache: greedy tokens over ZMQ and over HTTP identical to
transformers' generate on the same weights (fp32)."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from testing.model_fixtures import HfReference, make_tiny_checkpoint, random_prompt
from testing.server_process import start_server, wait_idle
from zserve.client import Client
from zserve.common.net_ports import free_port

NEW_TOKENS = 24
PREFIX = random_prompt(40, seed=100)
PROMPTS = [random_prompt(n, seed=n) for n in (3, 13, 29, 47)] + [PREFIX + random_prompt(9, seed=101), PREFIX]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_window"), "qwen2_window", with_tokenizer=True)


@pytest.fixture(scope="module")
def expected(model_dir):
    ref = HfReference(model_dir)
    return [ref.generate(p, NEW_TOKENS) for p in PROMPTS]


@pytest.fixture(scope="module")
def server(model_dir):
    http_port = free_port()
    handle = start_server(
        model_dir, "--dtype", "float32", "--chunked-prefill-size", "16", "--page-size", "4", "--kv-cache-tokens", "4096",
        "--max-running-requests", "8", "--num-threads", "1", "--http-port", str(http_port),
    )
    handle.http_port = http_port
    yield handle
    assert handle.stop() == 0, handle.log_tail()


def test_zmq_batch_and_prefix_hit_match_transformers(server, expected):
    with Client(server.port, timeout_s=120) as c:
        together = c.results(c.submit_all([{"input_ids": p} for p in PROMPTS[:-1]], max_tokens=NEW_TOKENS, ignore_eos=True))
        before = wait_idle(c)
        again = c.generate(input_ids=PROMPTS[-1], max_tokens=NEW_TOKENS, ignore_eos=True)  # the shared prefix, cached
        after = wait_idle(c)
    assert [r.output_ids for r in together] == expected[:-1]
    assert again.output_ids == expected[-1]
    assert after["num_prefix_hit_tokens"] - before["num_prefix_hit_tokens"] >= 32, (before, after)


def test_http_matches_transformers(server, expected):
    """POST /generate (the native API answers with output_ids), four requests at once."""

    def post(prompt: list[int]) -> list[int]:
        body = json.dumps({"input_ids": prompt, "max_tokens": NEW_TOKENS, "ignore_eos": True}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.http_port}/generate", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())["output_ids"]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(post, PROMPTS[:4])) == expected[:4]
