"""A request `submit`ted through either client is read back by its id: whole (`result`) or as a
stream (`stream_of`), in any order, with the same greedy output as `generate`."""

from __future__ import annotations

import asyncio

import pytest

from testing.server_process import start_server
from zserve.client import AsyncClient, Client

PROMPTS = ("Hello, world!", "The quick brown fox")


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "2048")
    yield handle
    assert handle.stop() == 0, handle.log_tail()


@pytest.fixture(scope="module")
def expected(server):
    with Client(server.port, timeout_s=60) as c:
        return [c.generate(p, max_tokens=12, ignore_eos=True) for p in PROMPTS]


def test_sync_client_reads_submitted_requests_back_by_id(server, expected):
    with Client(server.port, timeout_s=60) as c:
        first, second = (c.submit(p, max_tokens=12, ignore_eos=True) for p in PROMPTS)
        stream = c.stream_of(second)  # the later request first: outputs are filed per id
        text = "".join(stream)
        assert text == expected[1].text and stream.result.output_ids == expected[1].output_ids
        assert c.result(first).output_ids == expected[0].output_ids
        with pytest.raises(ValueError, match="not in flight on this client"):
            c.result(first)  # read to its end already
        with pytest.raises(ValueError, match="not in flight on this client"):
            c.stream_of(12345)


def test_async_client_reads_submitted_requests_back_by_id(server, expected):
    async def run():
        async with AsyncClient(server.port, timeout_s=60) as c:
            first, second = [await c.submit(p, max_tokens=12, ignore_eos=True) for p in PROMPTS]
            text = "".join([d async for d in c.stream_of(second)])
            assert text == expected[1].text
            assert (await c.result(first)).output_ids == expected[0].output_ids
            with pytest.raises(ValueError, match="not in flight on this client"):
                await c.result(first)
            with pytest.raises(ValueError, match="not in flight on this client"):
                [d async for d in c.stream_of(12345)]

    asyncio.run(run())
