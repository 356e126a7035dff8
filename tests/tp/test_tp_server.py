"""--tp-size 2 through the whole server (client -> text) is token-identical to --tp-size 1.

For three architectures (Llama with GQA, Qwen3 with q/k norms, GPT-2 with fused qkv, biases
and a vocabulary that does not split evenly), one tp 1 and one tp 2 server on the same tiny
checkpoint get the same requests: prompts longer than the chunked-prefill budget, a batch of
concurrent requests, and a prompt sharing a long prefix with an earlier one (a prefix hit).
Greedy ids and text must be identical, and the logprob of every sampled token (a function of
the full last-position logits) must agree to 1e-4.
"""

from __future__ import annotations

import subprocess
import threading

import numpy as np
import pytest

from testing.model_fixtures import make_tiny_checkpoint
from testing.paths import REPO_ROOT
from testing.server_process import ServerProcess, start_server
from zserve.client import Client

REPO = REPO_ROOT
BUDGET = 16  # --chunked-prefill-size: most prompts here are chunked
# fp32: logprobs agree to 1e-4 across tp sizes (bf16 partial sums, all-reduced, round differently)
FLAGS = ("--dtype", "float32", "--chunked-prefill-size", str(BUDGET), "--page-size", "4", "--kv-cache-tokens", "2048", "--num-threads", "1")
KINDS = {"llama": {}, "qwen3": {}, "gpt2": {"vocab_size": 601}}
PREFIX = "The quick brown fox jumps over the lazy dog. " * 3
BATCH_PROMPTS = ["Hello, world!", PREFIX + "Then it slept.", "你好，世界！ 🙂", "A"]
MAX_TOKENS = 16


def start_pair(model_dir) -> tuple[ServerProcess, ServerProcess]:
    """A tp 1 and a tp 2 server, loading at the same time."""
    handles: dict[int, ServerProcess] = {}
    errors: list[BaseException] = []

    def start(tp: int) -> None:
        try:
            handles[tp] = start_server(model_dir, *FLAGS, "--tp-size", str(tp), timeout_s=240)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(tp,)) for tp in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for handle in handles.values():
            handle.stop()
        raise errors[0]
    return handles[1], handles[2]


def run_workload(port: int) -> tuple[list, dict]:
    """[(ids, text, logprobs)] for the batch, then the prefix-hit request; and the server's stats."""
    with Client(port, timeout_s=120) as c:
        req_ids = [c.submit(p, max_tokens=MAX_TOKENS, ignore_eos=True, return_logprob=True) for p in BATCH_PROMPTS]
        results = [c.result(r) for r in req_ids]
        results.append(c.generate(PREFIX + "And then it ran away.", max_tokens=MAX_TOKENS, ignore_eos=True, return_logprob=True))
        stats = c.stats()
    return [(r.output_ids, r.text, r.logprobs) for r in results], stats


@pytest.fixture(scope="module", params=list(KINDS))
def outcome(request, tmp_path_factory):
    kind = request.param
    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(f"tp-{kind}"), kind, with_tokenizer=True, **KINDS[kind])
    single, sharded = start_pair(model_dir)
    try:
        yield kind, run_workload(single.port), run_workload(sharded.port), sharded
    finally:
        codes = (single.stop(), sharded.stop())
    assert codes == (0, 0), sharded.log()


def test_two_ranks_give_the_same_tokens_text_and_logprobs(outcome):
    kind, (single, _), (sharded, sharded_stats), _ = outcome
    assert len(single) == len(BATCH_PROMPTS) + 1
    for i, ((ids1, text1, lp1), (ids2, text2, lp2)) in enumerate(zip(single, sharded, strict=True)):
        assert ids2 == ids1, f"{kind}: request {i} differs at tp 2"
        assert text2 == text1, f"{kind}: request {i}"
        assert len(ids1) == MAX_TOKENS
        np.testing.assert_allclose(np.array(lp2, float), np.array(lp1, float), atol=1e-4, rtol=0, err_msg=f"{kind}: request {i}")
    assert sharded_stats["num_prefix_hit_tokens"] > 0, sharded_stats  # the last request reused the cached prefix


def test_the_server_runs_two_ranks(outcome):
    _, _, _, sharded = outcome
    log = sharded.log()
    assert "model rank 0 ready" in log and "model rank 1 ready" in log
    assert "2 tensor-parallel ranks on 1 node(s)" in log


def test_launch_check_script_sees_the_server(outcome):
    _, _, _, sharded = outcome
    proc = subprocess.run(["bash", "scripts/launch_check.sh", str(sharded.port)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"server tcp://127.0.0.1:{sharded.port} is up" in proc.stdout


def test_two_ranks_with_speculation_give_the_tokens_of_one_rank_without(model_dir):
    """Drafts travel to every rank in the batch; rank 0's verification decides (--tp-size 2 with
    n-gram speculation against --tp-size 1 without, greedy, on repetitive prompts)."""
    prompts = ["one two three four one two three four one two three four one two", "x y z x y z x y z x y z x y z x y z"]
    outputs, stats = [], []
    for flags in ((), ("--tp-size", "2", "--speculative-algorithm", "ngram")):
        handle = start_server(model_dir, *FLAGS, *flags, timeout_s=240)
        try:
            with Client(handle.port, timeout_s=120) as c:
                outputs.append([c.generate(p, max_tokens=40, ignore_eos=True).output_ids for p in prompts])
                stats.append(c.stats())
        finally:
            assert handle.stop() == 0
    assert outputs[1] == outputs[0]
    assert stats[1]["num_accepted_tokens"] > 0 and stats[0]["num_draft_tokens"] == 0
