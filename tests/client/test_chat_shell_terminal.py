"""`python -m zserve.client` on a real terminal (a pty): Ctrl-C stops the answer being streamed and
returns to the prompt, the conversation is kept for the next question, Ctrl-D exits 0."""

from __future__ import annotations

import os
import re
import sys

import pytest

from testing.paths import REPO_ROOT
from testing.pty_session import PtySession
from testing.server_process import start_server
from zserve.client import Client

MAX_TOKENS = 300
ADMITTED = re.compile(r"req (\d+) admitted: (\d+) prompt tokens")


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096")
    yield handle
    assert handle.stop() == 0, handle.log_tail()


def long_answer_question(client: Client) -> str:
    """A question whose greedy answer runs to MAX_TOKENS (no EOS), so Ctrl-C lands mid-answer."""
    for i in range(20):
        question = f"Tell me a long story, number {i}."
        if client.generate(messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS).finish_reason == "length":
            return question
    pytest.skip("no question among 20 has a greedy answer without EOS on this random model")


def test_ctrl_c_stops_the_answer_keeps_the_conversation_and_ctrl_d_exits_0(server):
    with Client(server.port, timeout_s=60) as c:
        first_q = long_answer_question(c)
        second_q = "And then?"
        single_turn_len = c.generate(messages=[{"role": "user", "content": second_q}], max_tokens=1).usage.prompt_tokens

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "zserve.client", "--zmq-port", str(server.port), "--max-tokens", str(MAX_TOKENS)]
    with PtySession.spawn(cmd, env) as term:
        at = term.expect("> ")
        term.send(first_q + "\r")
        at = term.expect(first_q, after=at)
        term.read_available(0.3)  # some of the answer streams
        term.send_interrupt()
        at = term.expect("[stopped]", after=at)
        at = term.expect("> ", after=at)
        term.send(second_q + "\r")
        at = term.expect(second_q, after=at)
        at = term.expect("> ", after=at, timeout_s=60)  # the second answer ran to its end
        term.send_eof()
        assert term.wait() == 0, term.output
        assert "Traceback" not in term.output, term.output

    admitted = [(int(r), int(n)) for r, n in ADMITTED.findall(server.log())]
    (first_id, first_len), (_, second_len) = admitted[-2:]
    assert f"req {first_id} aborted" in server.log(), "Ctrl-C did not abort the streamed request on the server"
    # the second question was sent with the first turn (question + the answer so far) before it
    assert second_len > first_len + 2 and second_len > single_turn_len + 2, (first_len, second_len, single_turn_len)
