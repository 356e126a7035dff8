"""A request ended by a stop string frees its id only once nothing in the server refers to it any more
(real processes, tiny random Llama, fp32): its client, reusing the id the moment the final answer
arrives (legal: ids are the client's), is always accepted and gets the same answer again, over and
over, and nothing is left behind.

The detokenizer is the one that matches a stop string: the scheduler hears of it through the frontend
(an AbortReq, STOP), on the same pipe as any later request naming the id, so it has let go of the old
request before it sees the new one. Before that, the detokenizer told the scheduler directly while the
final answer went out, and a quick reuse raced the abort on the scheduler's inbox: either the new
request was refused ("duplicate req_id ... still live") or, when the scheduler had finished the old one
already, the late abort ended the new one with no text.

The second test holds the abort and the reuse at the scheduler's door together whatever the machine's
speed: the detokenizer is stopped (SIGSTOP) while the request decodes, then the scheduler while the stop
string's answer goes out and the id comes back. (ZMQ happened to hand the two pipes' messages over in
the order they came in every run here, so these tests passed before the change too; the order ZMQ may
pick instead is forced in-process by tests/tokenizer/test_stop_abort_route.py, which failed before.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

from testing.server_process import start_server, wait_idle
from zserve.client import Client, ServerError

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2
MAX_TOKENS = 200  # far past the stop string: the scheduler still decodes the request when its answer is out
REQ_ID = 7_100_000_001
NUM_ROUNDS = 60
NUM_PAUSED_ROUNDS = 8
DECODE_S = (0.3, 1.5)  # how long the request decodes before the scheduler stops
GREEDY = {"max_tokens": MAX_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--page-size", "4", "--kv-cache-tokens", "4096",
                          "--num-threads", "1")
    yield handle
    assert handle.stop() == 0, handle.log()


@pytest.fixture(scope="module")
def stop_and_cut(server) -> tuple[str, str]:
    """A stop string early in the prompt's greedy text, and the text it leaves."""
    with Client(server.port, timeout_s=60) as c:
        full = c.generate(PROMPT, max_tokens=12, ignore_eos=True).text
    assert len(full) > 6
    stop = full[2:5]
    return stop, full[: full.index(stop)]


def answer(c: Client, req_id: int) -> tuple[str, str]:
    try:
        result = c.result(req_id)
    except ServerError as exc:
        return str(exc), "error"
    return result.text, result.finish_reason


def assert_nothing_left(c: Client, num_submitted: int) -> None:
    stats = wait_idle(c)
    assert (stats["num_running"], stats["num_used_pages"], stats["frontend_in_flight"]) == (0, 0, 0), stats
    assert stats["detokenizer_states"] == 0 and stats.get("requests_error_internal", 0) == 0, stats
    assert (stats["num_submitted"], stats["num_refused"]) == (num_submitted, 0), stats


def test_an_id_reused_right_after_a_stop_string_answer_is_always_accepted(server, stop_and_cut):
    stop, cut = stop_and_cut
    with Client(server.port, timeout_s=60) as c:
        num_submitted = c.stats()["num_submitted"]
        answers = [answer(c, c.submit(PROMPT, req_id=REQ_ID, stop=[stop], **GREEDY)) for _ in range(NUM_ROUNDS)]
        assert answers == [(cut, "stop")] * NUM_ROUNDS
        assert_nothing_left(c, num_submitted + NUM_ROUNDS)


def test_the_stop_abort_reaches_the_scheduler_before_the_id_comes_back(server, stop_and_cut):
    stop, cut = stop_and_cut
    detok, scheduler = server.child_pid("detokenizer_proc"), server.child_pid("scheduler_proc")
    with Client(server.port, timeout_s=60) as c:
        num_submitted = c.stats()["num_submitted"]
        answers = []
        for round_idx in range(NUM_PAUSED_ROUNDS):
            os.kill(detok, signal.SIGSTOP)  # the request decodes while its tokens wait for the detokenizer ...
            try:
                c.submit(PROMPT, req_id=REQ_ID, stop=[stop], **GREEDY)
                time.sleep(DECODE_S[round_idx % len(DECODE_S)])  # the longer ones to max_tokens, the shorter not
                os.kill(scheduler, signal.SIGSTOP)  # ... then the scheduler stops
            finally:
                os.kill(detok, signal.SIGCONT)
            try:  # the detokenizer matches the stop string: its answer comes while the scheduler is stopped
                answers.append(answer(c, REQ_ID))
                c.submit(PROMPT, req_id=REQ_ID, stop=[stop], **GREEDY)
                c.tokenize({"prompt": "x"})  # answered after the frontend passed the request on
            finally:
                os.kill(scheduler, signal.SIGCONT)
            answers.append(answer(c, REQ_ID))
        assert answers == [(cut, "stop")] * 2 * NUM_PAUSED_ROUNDS
        assert_nothing_left(c, num_submitted + 2 * NUM_PAUSED_ROUNDS)
