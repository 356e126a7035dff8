"""zserve.Engine with more prompts than the server queues: generate keeps a window of requests in
flight, below --max-queued-requests, so nothing is refused busy; the results come in the prompts'
order; a progress bar is written to stderr unless use_tqdm=False; a prompt refused busy anyway
(another client fills the queue) is sent again after a backoff. Without max_tokens a request
generates 128 tokens; {"max_tokens": None} runs to the context."""

from __future__ import annotations

import asyncio
import time

import pytest

import zserve
from testing.server_process import wait_idle

# 2 request slots and a queue of 8: before the window, a batch of 40 was refused busy
FLAGS = {"dtype": "float32", "num_threads": 1, "kv_cache_tokens": 8192, "max_running_requests": 2, "max_queued_requests": 8}
NUM_PROMPTS = 40
SAMPLING = {"max_tokens": 3, "ignore_eos": True}
CONTEXT_LEN = 512  # the tiny model's
FILLER_TOKENS = 120  # the other client's 2 running requests outlast queueing 8 more and the batch's first sends, 3x faster too


def prompts(num: int) -> list[list[int]]:
    """Prompt i is i + 1 token ids long, so each result's prompt_tokens names its prompt."""
    return [[10 + i % 50] * (i + 1) for i in range(num)]


def assert_in_prompt_order(results: list[zserve.GenerateResult], num: int, num_tokens: int) -> None:
    assert [r.usage.prompt_tokens for r in results] == [i + 1 for i in range(num)]
    assert all(r.finish_reason == "length" and len(r.output_ids) == num_tokens for r in results)


@pytest.fixture(scope="module")
def engine(model_dir):
    with zserve.Engine(str(model_dir), echo_logs=False, **FLAGS) as engine:
        yield engine


def test_the_window_stays_within_the_queue_cap(engine):
    assert engine.max_in_flight == 8  # min(--max-queued-requests 8, 4 per slot * 2 slots)


def test_more_prompts_than_the_queue_holds_come_back_in_order_with_a_progress_bar(engine, capsys):
    results = engine.generate(prompts(NUM_PROMPTS), SAMPLING)
    assert_in_prompt_order(results, NUM_PROMPTS, 3)
    bar = capsys.readouterr().err
    assert "Generating" in bar and f"{NUM_PROMPTS}/{NUM_PROMPTS}" in bar and "tok/s" in bar
    assert wait_idle(engine._live_client())["num_refused"] == 0  # the window never overflowed the queue


def test_use_tqdm_false_writes_no_progress_bar(engine, capsys):
    results = engine.generate(prompts(12), SAMPLING, use_tqdm=False)
    assert_in_prompt_order(results, 12, 3)
    assert capsys.readouterr().err == ""


def test_n_choices_with_the_window_come_in_turn(engine):
    results = engine.generate(prompts(10), {**SAMPLING, "n": 3}, use_tqdm=False)
    assert [r.usage.prompt_tokens for r in results] == [i + 1 for i in range(10) for _ in range(3)]


def test_agenerate_past_the_queue_cap_in_order(engine, capsys):
    results = asyncio.run(engine.agenerate(prompts(NUM_PROMPTS), SAMPLING))
    assert_in_prompt_order(results, NUM_PROMPTS, 3)
    assert capsys.readouterr().err == ""  # agenerate draws no bar unless asked
    results = asyncio.run(engine.agenerate(prompts(12), SAMPLING, use_tqdm=True))
    assert_in_prompt_order(results, 12, 3)
    assert "12/12" in capsys.readouterr().err


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_prompt_refused_busy_is_sent_again_after_a_backoff(engine, form):
    """Another client holds both slots and the whole queue: the batch's first sends are refused
    busy, and go again until the other client's requests make room."""
    with zserve.Client(engine.address, timeout_s=120) as other:
        before = other.stats()["num_refused"]
        filler = []
        for key, num in (("num_running", 2), ("num_waiting", 8)):  # both slots, then the whole queue
            filler += [other.submit(input_ids=[7, 8, 9], max_tokens=FILLER_TOKENS, ignore_eos=True) for _ in range(num)]
            deadline = time.monotonic() + 30
            while other.stats()[key] < num:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        if form == "sync":
            results = engine.generate(prompts(12), SAMPLING, use_tqdm=False)
        else:
            results = asyncio.run(engine.agenerate(prompts(12), SAMPLING))
        assert_in_prompt_order(results, 12, 3)
        assert all(len(other.result(req_id).output_ids) == FILLER_TOKENS for req_id in filler)
        assert other.stats()["num_refused"] > before  # the busy answers really came


def test_no_max_tokens_is_128_and_none_is_up_to_the_context(engine):
    [default] = engine.generate([[11, 12, 13]], {"ignore_eos": True}, use_tqdm=False)
    assert default.finish_reason == "length" and len(default.output_ids) == 128
    [params] = engine.generate([[11, 12, 13]], zserve.SamplingParams(ignore_eos=True), use_tqdm=False)
    assert params.output_ids == default.output_ids
    streamed = "".join(engine.stream([11, 12, 13], {"ignore_eos": True}))
    assert streamed == default.text
    [unbounded] = engine.generate([[11, 12, 13]], {"ignore_eos": True, "max_tokens": None}, use_tqdm=False)
    assert unbounded.finish_reason == "length" and len(unbounded.output_ids) == CONTEXT_LEN - 3
