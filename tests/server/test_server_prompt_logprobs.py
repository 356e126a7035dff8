"""Prompt logprobs (what completions' `echo` reports): every prompt token's logprob but the
first, and the k most likely at each position, equal to transformers' log_softmax over the whole
prompt (fp32); the same when the prompt is chunked, when its prefix is in the radix cache (it is
computed anyway: cached tokens have no logits), and for each of n copies."""

from __future__ import annotations

import pytest
import torch

from testing.e2e_fixtures import GreedyOracle
from testing.server_process import start_server
from zserve.client import Client, InvalidRequestError

TOP = 3


@pytest.fixture(scope="module")
def server(model_dir):
    # a 32-token prefill budget: a 100-token prompt takes 4 chunks
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096",
                          "--chunked-prefill-size", "32", "--page-size", "4")
    yield handle
    assert handle.stop() == 0, handle.log()


@torch.no_grad()
def expected(oracle: GreedyOracle, ids: list[int]) -> tuple[list[float], list[list[tuple[int, float]]]]:
    logprobs = torch.log_softmax(oracle.model(torch.tensor([ids])).logits[0].float(), -1)  # [P, vocab]
    chosen = [float(logprobs[p - 1, ids[p]]) for p in range(1, len(ids))]
    values, top_ids = torch.topk(logprobs[:-1], TOP, dim=-1)
    tops = [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(top_ids, values, strict=True)]
    return chosen, tops


def check(result, ids, want_lp, want_top):
    assert result.prompt_ids == ids
    assert result.prompt_logprobs[0] is None and result.prompt_top_logprobs[0] is None
    assert result.prompt_logprobs[1:] == pytest.approx(want_lp, abs=1e-4)
    assert len(result.prompt_top_logprobs) == len(ids)
    for got, want in zip(result.prompt_top_logprobs[1:], want_top, strict=True):
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-4)


def test_prompt_logprobs_match_transformers_chunked_cached_and_copied(server, oracle):
    ids = oracle.encode("The quick brown fox jumps over the lazy dog. " * 3)[:100]
    want_lp, want_top = expected(oracle, ids)
    with Client(server.port, timeout_s=120) as c:
        plain = c.generate(input_ids=ids, max_tokens=3)  # puts the prompt in the radix cache
        first = c.generate(input_ids=ids, max_tokens=3, prompt_logprobs=TOP)
        check(first, ids, want_lp, want_top)
        assert first.output_ids == plain.output_ids and first.usage.cached_tokens == 0  # computed whole, same answer
        req_id = c.submit(input_ids=ids, max_tokens=2, prompt_logprobs=TOP, n=2, temperature=1.0, seed=3)
        for i in range(2):
            check(c.result(req_id + i), ids, want_lp, want_top)
        only = c.generate(input_ids=ids[:5], max_tokens=1, prompt_logprobs=0)
        assert only.prompt_logprobs[1:] == pytest.approx(want_lp[:4], abs=1e-4) and only.prompt_top_logprobs is None
        assert c.generate(input_ids=ids, max_tokens=2).prompt_logprobs is None  # not asked: not computed
        with pytest.raises(InvalidRequestError, match="prompt_logprobs must be an integer in"):
            c.generate("x", prompt_logprobs=21)
        stats = c.stats()
    assert stats["num_used_pages"] == 0
