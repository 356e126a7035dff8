"""A MoE checkpoint through the whole server (ZMQ and HTTP) gives transformers' greedy tokens (HTTP: their text):
chunked prefill (prompts longer than the budget), a batch of mixed lengths in flight together,
and a prompt sharing a long prefix with an earlier one (a radix hit)."""

from __future__ import annotations

import asyncio

import pytest

from testing.http_client import HttpClient
from testing.model_fixtures import HfReference, make_tiny_checkpoint, random_prompt
from testing.server_process import free_port, start_server
from zserve.client import Client

FLAGS = ("--dtype", "float32", "--chunked-prefill-size", "16", "--page-size", "4", "--kv-cache-tokens", "2048",
         "--num-threads", "1")
MAX_TOKENS = 12
PROMPTS = [random_prompt(n, seed=n) for n in (3, 29, 1, 40)]
PREFIX_HIT = PROMPTS[3][:32] + random_prompt(9, seed=99)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_served_greedy_tokens_equal_transformers(tmp_path, kind):
    model_dir = make_tiny_checkpoint(tmp_path / kind, kind, with_tokenizer=True)
    ref = HfReference(model_dir)
    expected = [ref.generate(p, MAX_TOKENS) for p in [*PROMPTS, PREFIX_HIT]]
    http_port = free_port()
    handle = start_server(model_dir, *FLAGS, "--port", str(http_port), timeout_s=240)
    try:
        with Client(handle.port, timeout_s=120) as c:
            req_ids = [c.submit(input_ids=p, max_tokens=MAX_TOKENS, ignore_eos=True) for p in PROMPTS]
            results = [c.result(r) for r in req_ids]
            results.append(c.generate(input_ids=PREFIX_HIT, max_tokens=MAX_TOKENS, ignore_eos=True))
            stats = c.stats()
        http_texts = asyncio.run(http_outputs(http_port, [*PROMPTS, PREFIX_HIT]))
    finally:
        assert handle.stop() == 0, handle.log()
    assert [r.output_ids for r in results] == expected
    assert stats["num_prefix_hit_tokens"] > 0, stats
    assert http_texts == [r.text for r in results]  # the OpenAI API answers text: the same tokens, detokenized


async def http_outputs(port: int, prompts: list[list[int]]) -> list[str]:
    async with HttpClient(f"http://127.0.0.1:{port}", timeout_s=120) as client:
        results = await asyncio.gather(*(
            client.generate(input_ids=p, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0) for p in prompts
        ))
    return [r.text for r in results]
