"""End-to-end: real processes (launch_server) on a tiny random Llama with a real BPE tokenizer.

The oracle is transformers on the same weights: greedy token ids must be identical. Both run in
fp32 (`--dtype float32`): these tests are about serving, and fp32 keeps them token-exact;
bf16 numerics are tested against transformers in bf16 in tests/model/test_model_parity_bf16.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import zmq

from testing.server_process import start_server, wait_idle
from zserve.client import Client, ServerBusyError, ServerError

BUDGET = 16  # --chunked-prefill-size: small, so ordinary prompts are chunked
LONG_PREFIX = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(
        model_dir, "--dtype", "float32", "--chunked-prefill-size", str(BUDGET), "--page-size", "4", "--kv-cache-tokens", "4096",
        "--max-running-requests", "16", "--client-timeout-s", "2", "--num-threads", "1",
    )
    yield handle
    code = handle.stop()
    assert code == 0, handle.log()


def test_concurrent_clients_get_transformers_greedy_tokens(server, oracle):
    prompts = [
        "Hello, world!",
        "Hello, world!",  # identical prompts at the same moment
        LONG_PREFIX + "and then it ran away.",  # longer than the budget: chunked
        LONG_PREFIX + "but the dog woke up.",  # shares a long prefix with the one above
        "你好，世界！ 🙂",
        "A",
    ]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(indices: list[int]) -> None:
        try:
            with Client(server.port, timeout_s=60) as c:
                req_ids = {i: c.submit(prompts[i], max_tokens=24, ignore_eos=True) for i in indices}
                for i, rid in req_ids.items():
                    results[i] = c.result(rid).output_ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(idx,)) for idx in ([0, 2, 4], [1, 3], [5])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for i, prompt in enumerate(prompts):
        expected = oracle.greedy(oracle.encode(prompt), 24, stop_at_eos=False)
        assert results[i] == expected, f"prompt {i} differs from transformers"
    with Client(server.port) as c:
        stats = wait_idle(c)
    assert stats["num_prefix_hit_tokens"] > 0, stats  # the shared prefix was served from the cache


def test_identical_prompts_sent_together_are_computed_once(model_dir, oracle):
    """8 identical 200-token prompts, 4 greedy and 4 seeded-sampled, reach the scheduler together
    (it is stopped while they are sent, so they meet in one admission round whatever the timing):
    200 prompt tokens computed, every first token in one step, each output what it is alone."""
    handle = start_server(model_dir, "--dtype", "float32", "--kv-cache-tokens", "4096", "--num-threads", "1")
    try:
        ids = oracle.encode(LONG_PREFIX * 4)[:200]
        assert len(ids) == 200
        params = [{}] * 4 + [{"temperature": 0.9, "seed": 100 + i} for i in range(4)]
        with Client(handle.port, timeout_s=120) as c:
            before = c.stats()
            scheduler_pid = handle.child_pid("scheduler_proc")
            os.kill(scheduler_pid, signal.SIGSTOP)
            try:
                req_ids = [c.submit(input_ids=ids, max_tokens=8, ignore_eos=True, **p) for p in params]
                time.sleep(1.0)  # the tokenizer passes them on; they wait in the scheduler's socket
            finally:
                os.kill(scheduler_pid, signal.SIGCONT)
            together = [c.result(r).output_ids for r in req_ids]
            after = wait_idle(c)
            alone = [c.generate(input_ids=ids, max_tokens=8, ignore_eos=True, **params[i]).output_ids for i in (0, 5)]
    finally:
        assert handle.stop() == 0, handle.log()
    assert after["num_prefilled_tokens"] - before["num_prefilled_tokens"] == 200, after
    assert after["num_steps"] - before["num_steps"] == 8  # one prefill step gave every first token, then 7 decodes
    # the loop timed the 8 steps: waiting for the worker, and its own time between the 7 back-to-back ones
    assert after["step_wait_s"] - before["step_wait_s"] > 0 and after["schedule_s"] - before["schedule_s"] > 0
    assert after["schedule_s"] - before["schedule_s"] < after["step_wait_s"] - before["step_wait_s"]
    # inside the wait, the worker's own forward time (StepResult.forward_ms): positive, and less than the wait
    assert 0 < after["worker_forward_s"] - before["worker_forward_s"] < after["step_wait_s"] - before["step_wait_s"]
    assert together[:4] == [oracle.greedy(ids, 8, stop_at_eos=False)] * 4 == [alone[0]] * 4
    assert together[5] == alone[1]


def test_chat_messages_and_input_ids_match_transformers(server, oracle):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with Client(server.port, timeout_s=60) as c:
        chat = c.generate(messages=messages, max_tokens=12)
        ids = oracle.encode("Tokens in, tokens out.")
        raw = c.generate(input_ids=ids, max_tokens=12)
    expected_chat = oracle.greedy(oracle.chat_ids(messages), 12)
    assert chat.output_ids == expected_chat
    assert chat.finish_reason == ("stop" if expected_chat[-1] == 2 and len(expected_chat) < 12 else "length")
    assert chat.usage.prompt_tokens == len(oracle.chat_ids(messages))
    assert chat.usage.completion_tokens == len(expected_chat)
    assert raw.output_ids == oracle.greedy(ids, 12)


def test_stream_deltas_concatenate_to_the_text_and_never_split_characters(server, oracle):
    with Client(server.port, timeout_s=60) as c:
        full = c.generate("Emoji time: 🙂 🚀", max_tokens=40, ignore_eos=True)
        stream = c.stream("Emoji time: 🙂 🚀", max_tokens=40, ignore_eos=True)
        deltas = list(stream)
    assert "".join(deltas) == full.text == stream.result.text
    # A character split across deltas would show up as extra U+FFFD in the stream: the whole
    # must equal transformers' decode of all ids (invalid bytes from a random model decode to
    # U+FFFD there too). The detokenizer's own tests cover split characters exhaustively.
    assert full.text == oracle.decode(full.output_ids)
    assert all(deltas)


def test_stop_string_cuts_exactly_and_is_never_streamed(server):
    with Client(server.port, timeout_s=60) as c:
        full = c.generate(LONG_PREFIX, max_tokens=40, ignore_eos=True).text
        assert len(full) > 12
        stop = full[8:11]  # a stop string in the middle of the greedy text
        cut = full[: full.index(stop)]
        result = c.generate(LONG_PREFIX, max_tokens=40, ignore_eos=True, stop=[stop])
        stream = c.stream(LONG_PREFIX, max_tokens=40, ignore_eos=True, stop=[stop])
        deltas = list(stream)
    assert result.text == cut and result.finish_reason == "stop"
    assert "".join(deltas) == cut and stream.result.finish_reason == "stop"
    assert result.usage.completion_tokens < 40  # the scheduler stopped decoding it too


def test_abort_mid_stream_frees_everything(server):
    with Client(server.port, timeout_s=60) as c:
        stream = c.stream("Once upon a time", max_tokens=400, ignore_eos=True)
        pieces = []
        for delta in stream:
            pieces.append(delta)
            if len(pieces) == 3:
                c.abort(stream.req_id)
        assert stream.result.finish_reason == "abort"
        assert stream.result.usage.completion_tokens < 400
        stats = wait_idle(c)
    assert stats["num_used_pages"] == 0, stats


def test_client_disconnect_mid_stream_aborts_its_request(server, tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, os\n"
        "from client import Client\n"
        f"c = Client({server.port})\n"
        "s = c.stream('Once upon a time', max_tokens=100000 // 250, ignore_eos=True)\n"
        "next(iter(s)); print('streaming', flush=True)\n"
        "os._exit(0)\n"  # dies without closing: only the missing heartbeats tell the server
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "streaming" in proc.stdout, proc.stderr
    with Client(server.port) as c:
        stats = wait_idle(c, timeout_s=15)
    assert stats["num_used_pages"] == 0 and stats["num_running"] == 0, stats


BAD_REQUESTS = [
    ({"prompt": ""}, "empty"),
    ({"prompt": "hi " * 600}, "context"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "temperature": -1.0}, "temperature"),
    ({"prompt": "hi", "top_p": 0.0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"input_ids": [1, 2, 10**6]}, "token"),
    ({"input_ids": [-1]}, "token"),
]


@pytest.mark.parametrize(("kwargs", "needle"), BAD_REQUESTS, ids=[n for _, n in BAD_REQUESTS])
def test_bad_input_gets_a_clear_error_while_others_are_served(server, kwargs, needle):
    with Client(server.port, timeout_s=60) as c:
        good = c.submit("A good request", max_tokens=8, ignore_eos=True)
        with pytest.raises(ServerError, match=needle):
            c.generate(**kwargs)
        assert c.result(good).finish_reason == "length"


def test_garbage_frames_on_the_client_port_are_survived(server):
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.connect(server.address)
    for frame in (b"", b"\x00garbage\xff", b"\x93\x0a\xa1x\xc0", b"\x92\x0a" + b"\x00" * 50):
        raw.send(frame)
    raw.send_multipart([b"two", b"frames"])
    raw.close(linger=500)
    ctx.term()
    with Client(server.port, timeout_s=60) as c:
        assert c.generate("still alive?", max_tokens=4, ignore_eos=True).finish_reason == "length"


def test_full_queue_refuses_with_server_busy(model_dir):
    handle = start_server(
        model_dir, "--max-queued-requests", "2", "--max-running-requests", "1", "--kv-cache-tokens", "2048",
        "--num-threads", "1",
    )
    try:
        with Client(handle.port, timeout_s=120) as c:
            req_ids = [c.submit("Once upon a time", max_tokens=64, ignore_eos=True) for _ in range(8)]
            outcomes = []
            for rid in req_ids:
                try:
                    outcomes.append(c.result(rid).finish_reason)
                except ServerBusyError as exc:
                    assert "server busy" in str(exc)
                    outcomes.append("busy")
        assert "busy" in outcomes and "length" in outcomes, outcomes
    finally:
        assert handle.stop() == 0, handle.log()


def test_max_tokens_beyond_the_context_is_refused_and_none_runs_up_to_the_context(server, oracle):
    input_ids = (oracle.encode(LONG_PREFIX) * 20)[:400]
    with Client(server.port, timeout_s=120) as c:
        with pytest.raises(ServerError, match=r"maximum context length is 512 tokens\. However, you requested 1400 tokens "
                                              r"\(400 in the prompt, 1000 in the completion\)"):
            c.generate(input_ids=input_ids, max_tokens=1000, ignore_eos=True)
        result = c.generate(input_ids=input_ids, ignore_eos=True, max_tokens=None)  # None: up to the context
    assert result.finish_reason == "length" and len(result.output_ids) == 512 - 400


def test_a_small_pool_retracts_and_every_output_is_still_the_greedy_one(model_dir, oracle):
    """56 pages of 4 tokens, a context of 128: 8 requests that each run to the context cannot all
    hold their pages at once, so some are retracted and resumed (under overlap scheduling: a step
    short of pages waits for the one in flight, then retracts); every output is still exactly
    transformers' greedy output, /metrics-visible stats count the retractions, nothing leaks."""
    handle = start_server(
        model_dir, "--dtype", "float32", "--page-size", "4", "--kv-cache-tokens", "224", "--context-length", "128", "--num-threads", "1",
        "--chunked-prefill-size", "64", "--enable-overlap-schedule",
    )
    try:
        prompts = [f"Story {i}: once upon a time" for i in range(8)]
        with Client(handle.port, timeout_s=120) as c:
            req_ids = [c.submit(p, ignore_eos=True, max_tokens=None) for p in prompts]  # None: up to the context
            results = [c.result(rid) for rid in req_ids]
            stats = wait_idle(c)
        for prompt, result in zip(prompts, results, strict=True):
            ids = oracle.encode(prompt)
            assert result.output_ids == oracle.greedy(ids, 128 - len(ids), stop_at_eos=False)
            assert result.finish_reason == "length" and result.usage.prompt_tokens == len(ids)
        assert stats["num_retracted"] > 0 and stats["num_finished"] == 8, stats
        assert stats["num_used_pages"] == 0 and stats["num_free_pages"] + stats["num_cached_pages"] == 56, stats
        assert stats["num_overlapped_steps"] > 0, stats
        assert "retracted:" in handle.log()
    finally:
        assert handle.stop() == 0, handle.log()


def test_terminal_chat_streams_keeps_the_conversation_and_resets(server, oracle):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "zserve.client", "--zmq-port", str(server.port), "--max-tokens", "6"],
        input="Hello there\nAnd again\n/reset\n/quit\n", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    first = oracle.decode(oracle.greedy(oracle.chat_ids([{"role": "user", "content": "Hello there"}]), 6))
    assert first and first in proc.stdout
    assert "(conversation cleared)" in proc.stdout
    # the second turn was answered with the first exchange in its context
    history = [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And again"},
    ]
    assert oracle.decode(oracle.greedy(oracle.chat_ids(history), 6)) in proc.stdout
