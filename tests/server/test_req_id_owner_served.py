"""A request id belongs to the client that sent it (real processes, tiny random Llama, fp32): a second
client naming an id another client's request holds (one of an `n` request's choice ids too) is
refused, and the holder's request ends with exactly the tokens it gets alone, nothing left behind.

The scheduler is stopped (SIGSTOP) while the ids clash, so the holder's requests are in flight
whatever the machine's speed; the refusals come from the frontend, which runs on."""

from __future__ import annotations

import pytest

from testing.processes import paused
from testing.server_process import start_server, wait_idle
from zserve.client import Client, InvalidRequestError, ServerError

PROMPT = "The quick brown fox jumps over the lazy dog."
MAX_TOKENS = 24
SINGLE_ID = 7_000_000_001
CHOICES_ID = 7_000_000_101  # n=2: 7_000_000_101 and 7_000_000_102


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--page-size", "4", "--kv-cache-tokens", "4096",
                          "--num-threads", "1")
    yield handle
    assert handle.stop() == 0, handle.log()


def test_a_second_client_reusing_an_id_in_flight_is_refused_and_the_owner_gets_its_tokens_alone(server):
    greedy = {"max_tokens": MAX_TOKENS, "ignore_eos": True}
    with Client(server.port, timeout_s=60) as owner, Client(server.port, timeout_s=60) as other:
        alone = owner.generate(PROMPT, **greedy).output_ids
        with paused([server.child_pid("scheduler_proc")]):
            owner.submit(PROMPT, req_id=SINGLE_ID, **greedy)
            owner.submit(PROMPT, req_id=CHOICES_ID, n=2, **greedy)
            owner.tokenize({"prompt": "x"})  # answered by the frontend after the two above, on the same socket
            with pytest.raises(InvalidRequestError, match=f"req_id {SINGLE_ID} is already in flight on this client"):
                owner.submit("Mine again", req_id=SINGLE_ID)  # refused by the client itself, before sending
            # another client: the id itself, the second choice's id, and an n=2 range reaching the first choice
            for req_id, n, clash in ((SINGLE_ID, 1, SINGLE_ID), (CHOICES_ID + 1, 1, CHOICES_ID + 1),
                                     (CHOICES_ID - 1, 2, CHOICES_ID)):
                other.submit("Someone else's prompt", req_id=req_id, n=n, max_tokens=4)
                for choice_id in range(req_id, req_id + n):
                    with pytest.raises(ServerError, match=f"req_id {clash} is already in flight for another client"):
                        other.result(choice_id)
        results = [owner.result(r) for r in (SINGLE_ID, CHOICES_ID, CHOICES_ID + 1)]
        stats = wait_idle(owner)
    assert [r.output_ids for r in results] == [alone] * 3
    assert [r.finish_reason for r in results] == ["length"] * 3
    assert (stats["num_running"], stats["num_used_pages"], stats["frontend_in_flight"]) == (0, 0, 0), stats
    # alone, the single request and the 2 choices; the 4 refusals never reached the scheduler
    assert (stats["num_submitted"], stats["requests_error_internal"]) == (4, 4), stats
