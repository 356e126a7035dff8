"""Phi-4-mini's layout served end to end (launch_server, ZMQ and HTTP) on a tiny random checkpoint:
fused qkv / gate_up, a partial rotary and longrope, with chunked prefill (a budget of 16), a radix
prefix hit and requests of mixed lengths in flight together. The oracle is transformers on the same
weights (HfReference: it keeps the cache across the longrope switch, as zserve does; see
model_proc/layers/rope_frequencies.py). Prompts stay below the original context (48) so no prompt
is chunked across it; the decodes cross it."""

from __future__ import annotations

import asyncio

import pytest

from testing.http_client import HttpClient
from testing.model_fixtures import HfReference, make_tiny_checkpoint, random_prompt
from testing.server_process import free_port, start_server, wait_idle
from zserve.client import Client

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp("phi4"), "phi4_partial", with_tokenizer=True)
    handle = start_server(
        model_dir, "--dtype", "float32", "--chunked-prefill-size", "16", "--page-size", "4", "--kv-cache-tokens", "2048",
        "--http-port", str(free_port()), "--num-threads", "1",
    )
    yield handle, HfReference(model_dir)
    assert handle.stop() == 0, handle.log()


def test_zmq_and_http_give_transformers_greedy_tokens(served):
    server, ref = served
    shared = random_prompt(24, seed=1)
    prompts = [shared + random_prompt(12, seed=2), random_prompt(3, seed=3), random_prompt(30, seed=4)]
    with Client(server.port, timeout_s=120) as c:
        first = c.generate(input_ids=shared + random_prompt(4, seed=5), max_tokens=4, ignore_eos=True)  # fills the cache
        req_ids = [c.submit(input_ids=p, max_tokens=NEW_TOKENS, ignore_eos=True) for p in prompts]
        results = [c.result(r) for r in req_ids]
        stats = wait_idle(c)
    assert first.output_ids == ref.generate(shared + random_prompt(4, seed=5), 4)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_ids == ref.generate(prompt, NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    assert stats["num_prefix_hit_tokens"] > 0, stats

    async def over_http():
        async with HttpClient(f"http://127.0.0.1:{server.http_port}") as hc:
            return await hc.generate(input_ids=prompts[2], max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)

    assert asyncio.run(over_http()).text == results[2].text
