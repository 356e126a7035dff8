"""Overlap scheduling served end to end on the tiny model, fp32: the same burst of requests gives the same tokens with
overlap on (--enable-overlap-schedule) and off (the CPU's default), with and without speculative decoding: chunked
prompts, shared prefixes (radix hits), n copies, penalties, a grammar, stop strings (the detokenizer ends those, one
step late under overlap), logprobs and seeded sampling; the greedy ones are transformers' tokens. The server with
overlap really sends steps ahead (the stats say), and every page comes back."""

from __future__ import annotations

import pytest

from testing.server_process import start_server, wait_idle
from zserve import Client

SHARED = "The quick brown fox jumps over the lazy dog while the cat watches from the old stone wall. " * 3


def burst(client: Client, stop: str) -> list[tuple]:
    """Every kind of request at once; what each answered. `stop`: a stop string its greedy text holds."""
    bodies = [
        dict(prompt=SHARED + "Then", max_tokens=24, ignore_eos=True),  # chunked (16-token chunks)
        dict(prompt=SHARED + "After that", max_tokens=20, ignore_eos=True),  # a radix hit on the shared prefix
        dict(prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7, n=3),
        dict(prompt="Numbers: 1 2 3", max_tokens=18, repetition_penalty=1.3, frequency_penalty=0.4, ignore_eos=True),
        dict(prompt="Code:", max_tokens=12, temperature=1.0, seed=3, regex=r"[a-c]{3}-[0-9]{2}"),
        dict(prompt="Hello there", max_tokens=30, stop=[stop], ignore_eos=True),
        dict(prompt="Logprobs please", max_tokens=10, return_logprob=True, top_logprobs=2, ignore_eos=True),
        dict(prompt="A short one", max_tokens=3),
    ]
    req_ids = client.submit_all(bodies)
    results = client.results(req_ids)
    return [
        (r.output_ids, r.text, r.finish_reason, None if r.logprobs is None else [round(x, 4) for x in r.logprobs])
        for r in results
    ]


def served(model_dir, stop: str, *flags: str):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--chunked-prefill-size", "16",
                          "--page-size", "4", "--kv-cache-tokens", "4096", *flags)
    try:
        with Client(handle.port, timeout_s=120) as c:
            first = burst(c, stop)
            again = burst(c, stop)  # now every shared prefix is in the radix cache
            stats = wait_idle(c)
            return first, again, stats
    finally:
        handle.stop()


@pytest.mark.parametrize("speculative", [(), ("--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "3")],
                         ids=["plain", "ngram"])
def test_the_same_burst_gives_the_same_tokens_with_overlap_on_and_off(model_dir, oracle, speculative):
    text = oracle.decode(oracle.greedy(oracle.encode("Hello there"), 30, stop_at_eos=False))
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # ends the request half-way: the detokenizer's finish
    on_first, on_again, on_stats = served(model_dir, stop, "--enable-overlap-schedule", *speculative)
    off_first, off_again, off_stats = served(model_dir, stop, *speculative)  # auto: off on a CPU
    assert on_first == off_first and on_again == off_again
    greedy = on_first[0][0]
    assert greedy == oracle.greedy(oracle.encode(SHARED + "Then"), 24, stop_at_eos=False)
    assert on_first[7][2] == "stop" and on_first[8][3] is not None  # the stop strings' and the logprobs' answers
    assert off_stats["num_overlapped_steps"] == 0
    if not speculative:  # under speculation every decoding row waits for its result (its drafts need it)
        assert on_stats["num_overlapped_steps"] > 0.3 * on_stats["num_steps"], on_stats
    for stats in (on_stats, off_stats):
        assert stats["num_used_pages"] == 0 and stats["num_running"] == 0, stats
