"""Speculative decoding served end to end on the tiny model: with `--speculative-algorithm ngram` the
greedy outputs are the tokens of a server without it (the worker verifies the scheduler's n-gram
drafts), and so are seeded sampled ones; drafts are made and some accepted on repetitive text, and
the stats count them."""

from __future__ import annotations

import pytest

from testing.server_process import start_server, wait_idle
from zserve.client import Client

PROMPTS = [
    "one two three four one two three four one two three four one two",
    "The list: apple, banana, cherry, apple, banana, cherry, apple, banana,",
    "A prompt with little to copy from, about clouds and rivers",
    "x y z x y z x y z x y z x y z x y z x y z x y z x y z",
]


def start(model_dir, *extra):
    return start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096",
                        "--max-running-requests", "8", "--page-size", "4", *extra)


@pytest.fixture(scope="module")
def outputs_without(model_dir):
    handle = start(model_dir)
    try:
        with Client(handle.port, timeout_s=120) as c:
            greedy = [c.generate(p, max_tokens=40, ignore_eos=True).output_ids for p in PROMPTS]
            sampled = [c.generate(p, max_tokens=40, ignore_eos=True, temperature=0.8, seed=5).output_ids for p in PROMPTS]
        yield greedy, sampled
    finally:
        assert handle.stop() == 0


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start(model_dir, "--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "4")
    yield handle
    assert handle.stop() == 0


def test_greedy_outputs_are_identical_and_drafts_get_accepted(server, outputs_without):
    outputs_without = outputs_without[0]
    with Client(server.port, timeout_s=120) as c:
        before = wait_idle(c)
        one_by_one = [c.generate(p, max_tokens=40, ignore_eos=True).output_ids for p in PROMPTS]
        together = [r.output_ids for r in c.generate_batch(PROMPTS, max_tokens=40, ignore_eos=True)]
        after = wait_idle(c)
    assert one_by_one == outputs_without
    assert together == outputs_without
    assert after["num_draft_tokens"] > before["num_draft_tokens"]
    assert after["num_accepted_tokens"] > before["num_accepted_tokens"]
    assert after["num_generated_tokens"] - before["num_generated_tokens"] == 2 * 40 * len(PROMPTS)


def test_seeded_sampled_outputs_do_not_depend_on_drafting(server, outputs_without):
    """The worker draws each verified position as plain decoding would (model_proc/draft_verifier.py)."""
    with Client(server.port, timeout_s=120) as c:
        sampled = [c.generate(p, max_tokens=40, ignore_eos=True, temperature=0.8, seed=5).output_ids for p in PROMPTS]
    assert sampled == outputs_without[1]


def test_rows_asking_for_logprobs_are_not_drafted_and_still_answer(server, outputs_without):
    outputs_without = outputs_without[0]
    with Client(server.port, timeout_s=120) as c:
        before = wait_idle(c)
        result = c.generate(PROMPTS[0], max_tokens=40, ignore_eos=True, return_logprob=True)
        after = wait_idle(c)
    assert result.output_ids == outputs_without[0]
    assert after["num_draft_tokens"] == before["num_draft_tokens"]
