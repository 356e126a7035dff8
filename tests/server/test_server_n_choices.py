"""n choices of one prompt: one request with `n`, queued together by the scheduler, so the prompt
is prefilled once and each choice decodes on its own seed stream (seed + i)."""

from __future__ import annotations

import time

import pytest

from testing.server_process import start_server, wait_idle
from zserve.client import Client


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096",
                          "--max-running-requests", "8")
    yield handle
    assert handle.stop() == 0


def test_n_4_prefills_the_prompt_once_and_returns_4_seeded_choices(server):
    prompt = "A prompt nobody sent before: " + "the quick brown fox " * 5
    with Client(server.port, timeout_s=60) as c:
        before = wait_idle(c)
        req_id = c.submit(prompt, max_tokens=8, n=4, temperature=1.0, seed=3, ignore_eos=True)
        results = [c.result(req_id + i) for i in range(4)]
        after = wait_idle(c)
        singles = [c.generate(prompt, max_tokens=8, temperature=1.0, seed=3 + i, ignore_eos=True) for i in range(4)]
    prompt_len = results[0].usage.prompt_tokens
    assert after["num_prefilled_tokens"] - before["num_prefilled_tokens"] == prompt_len  # one prefill for 4 choices
    assert after["num_generated_tokens"] - before["num_generated_tokens"] == 4 * 8
    assert [r.output_ids for r in results] == [s.output_ids for s in singles]  # choice i is seeded seed + i
    assert len({tuple(r.output_ids) for r in results}) > 1


def test_n_out_of_range_is_refused(server):
    from zserve.client import InvalidRequestError

    with Client(server.port, timeout_s=30) as c, pytest.raises(InvalidRequestError, match=r"n must be an integer in \[1, 128\]"):
        c.generate("hi", n=500)


def test_batches_return_every_choice_in_turn_and_one_choice_methods_refuse_n(server):
    """generate_batch with n: each prompt's n choices in turn (p * n + i), sync and async; generate
    and stream answer one choice, so they refuse n=2 before sending anything."""
    import asyncio

    from zserve.client import AsyncClient, InvalidRequestError

    prompts = ["First prompt of the batch", "Second prompt, a different one"]
    sampling = dict(max_tokens=6, n=3, temperature=1.0, seed=21, ignore_eos=True)
    with Client(server.port, timeout_s=60) as c:
        results = c.generate_batch(prompts, **sampling)
        singles = [c.generate(p, max_tokens=6, temperature=1.0, seed=21 + i, ignore_eos=True) for p in prompts for i in range(3)]
        before = wait_idle(c)
        for method in (c.generate, c.stream):
            with pytest.raises(InvalidRequestError, match=r"answers one choice but n=2"):
                method(prompts[0], n=2)
        assert wait_idle(c)["num_submitted"] == before["num_submitted"]  # nothing was sent
        assert not c._core.requests  # nor is anything waiting to be read
    assert [r.output_ids for r in results] == [s.output_ids for s in singles]

    async def async_batch():
        async with AsyncClient(server.port, timeout_s=60) as ac:
            with pytest.raises(InvalidRequestError, match=r"n=2"):
                await ac.generate(prompts[0], n=2)
            return await ac.generate_batch(prompts, **sampling)

    assert [r.output_ids for r in asyncio.run(async_batch())] == [s.output_ids for s in singles]


def test_a_failed_batch_aborts_the_rest_and_leaves_nothing_queued(server):
    """results(): when one request of a batch fails, the unread ones are aborted on the server and
    dropped in the client; submit_all(): when one body cannot be sent, those sent are aborted."""
    from zserve.client import InvalidRequestError

    with Client(server.port, timeout_s=60) as c:
        before = wait_idle(c)
        req_ids = c.submit_all([{"prompt": "short"}, {"input_ids": [10**6]}, {"prompt": "long"}], max_tokens=400, ignore_eos=True)
        assert len(req_ids) == 3
        c.abort(req_ids[0])  # the first ends at once; the second is refused; the third runs until it is aborted
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            c.results(req_ids)
        assert not c._core.requests
        after = wait_idle(c)
        ended = {key: after[key] - before[key] for key in ("num_aborted", "num_finished")}  # "long": see below
        assert ended["num_aborted"] + ended["num_finished"] == 2 and ended["num_aborted"] >= 1, ended
        with pytest.raises(InvalidRequestError, match="surrogate"):  # msgpack cannot carry it: refused in the client
            c.submit_all([{"prompt": "sent first"}, {"prompt": "lone \ud800"}], max_tokens=400, ignore_eos=True)
        assert not c._core.requests
        assert wait_idle(c)["num_aborted"] - after["num_aborted"] == 1


def test_a_failed_async_batch_cancels_the_other_reads_and_aborts_them(server):
    """AsyncClient.results: the refused request raises, the other reads are cancelled, and their
    requests are aborted on the server; nothing stays queued in the client."""
    import asyncio

    from zserve.client import AsyncClient, InvalidRequestError

    async def failed_batch() -> dict:
        async with AsyncClient(server.port, timeout_s=60) as ac:
            req_ids = await ac.submit_all([{"prompt": "long one"}, {"input_ids": [10**6]}], max_tokens=400, ignore_eos=True)
            with pytest.raises(InvalidRequestError, match="vocabulary"):
                await ac.results(req_ids)
            assert not ac._core.requests
            with pytest.raises(InvalidRequestError, match="surrogate"):
                await ac.submit_all([{"prompt": "sent first"}, {"prompt": "lone \ud800"}], max_tokens=400, ignore_eos=True)
            assert not ac._core.requests

    with Client(server.port, timeout_s=60) as c:
        before = wait_idle(c)
        asyncio.run(failed_batch())
        # "sent first" and its abort may still be on their way through the tokenizer when the server first
        # looks idle: poll until both sent requests have ended (or the deadline)
        deadline = time.monotonic() + 15
        while True:
            after = wait_idle(c)
            ended = {key: after[key] - before[key] for key in ("num_aborted", "num_finished")}
            if sum(ended.values()) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    # both sent requests ended, and "sent first" (aborted as its batch failed to encode) surely by the abort; the
    # "long one" too, unless a loaded machine let its 400 tokens finish before the client's abort arrived
    assert ended["num_aborted"] + ended["num_finished"] == 2 and ended["num_aborted"] >= 1, ended
