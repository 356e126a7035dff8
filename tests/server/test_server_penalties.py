"""Penalties, logit bias and min_tokens end to end, against transformers on the same weights:
repetition_penalty through transformers' own RepetitionPenaltyLogitsProcessor, presence and
frequency penalties by OpenAI's formula on transformers' logits; greedy, token-exact."""

from __future__ import annotations

import pytest
import torch

from testing.e2e_fixtures import EOS_ID, GreedyOracle
from testing.server_process import start_server
from zserve.client import Client

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
NUM_TOKENS = 24


@pytest.fixture(scope="module")
def server(model_dir):
    handle = start_server(model_dir, "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "4096")
    yield handle
    assert handle.stop() == 0


@torch.no_grad()
def oracle_greedy(oracle: GreedyOracle, prompt_ids: list[int], adjust) -> list[int]:
    """Greedy continuation with `adjust(ids_so_far, output_so_far, logits) -> logits` on each step's logits."""
    ids, out = list(prompt_ids), []
    for _ in range(NUM_TOKENS):
        logits = oracle.model(torch.tensor([ids])).logits[0, -1].float()
        nxt = int(adjust(ids, out, logits).argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_transformers_logits_processor(server, oracle, penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    processor = RepetitionPenaltyLogitsProcessor(penalty)
    prompt_ids = oracle.encode(PROMPT)
    expected = oracle_greedy(oracle, prompt_ids, lambda ids, _, logits: processor(torch.tensor([ids]), logits[None])[0])
    with Client(server.port, timeout_s=60) as c:
        got = c.generate(input_ids=prompt_ids, max_tokens=NUM_TOKENS, ignore_eos=True, repetition_penalty=penalty).output_ids
        plain = c.generate(input_ids=prompt_ids, max_tokens=NUM_TOKENS, ignore_eos=True).output_ids
    assert got == expected
    assert got != plain, "the penalty changed nothing on this prompt: the test would not see a broken one"


@pytest.mark.parametrize(("presence", "frequency"), [(1.5, 0.0), (0.0, 0.7), (0.5, 0.5), (-1.0, 0.0)])
def test_presence_and_frequency_penalties_follow_openais_formula(server, oracle, presence, frequency):
    def adjust(_ids, out, logits):
        logits = logits.clone()
        for token in set(out):
            logits[token] -= out.count(token) * frequency + presence
        return logits

    prompt_ids = oracle.encode(PROMPT)
    expected = oracle_greedy(oracle, prompt_ids, adjust)
    with Client(server.port, timeout_s=60) as c:
        result = c.generate(input_ids=prompt_ids, max_tokens=NUM_TOKENS, ignore_eos=True,
                            presence_penalty=presence, frequency_penalty=frequency)
    assert result.output_ids == expected


def test_logit_bias_and_min_tokens(server, oracle):
    prompt_ids = oracle.encode(PROMPT)
    with Client(server.port, timeout_s=60) as c:
        forced = c.generate(input_ids=prompt_ids, max_tokens=6, ignore_eos=True, logit_bias={"77": 100.0})
        assert forced.output_ids == [77] * 6
        as_ints = c.generate(input_ids=prompt_ids, max_tokens=6, ignore_eos=True, logit_bias={77: 100})  # Python's keys
        assert as_ints.output_ids == [77] * 6
        # EOS made the likeliest token: it ends the request at once, unless min_tokens holds it back
        at_once = c.generate(input_ids=prompt_ids, max_tokens=20, logit_bias={str(EOS_ID): 100.0})
        held = c.generate(input_ids=prompt_ids, max_tokens=20, logit_bias={str(EOS_ID): 100.0}, min_tokens=5)
        raw = c.generate(input_ids=prompt_ids, max_tokens=3, ignore_eos=True, return_logprob=True, logit_bias={"77": 100.0})
    assert at_once.finish_reason == "stop" and at_once.usage.completion_tokens == 1
    assert held.finish_reason == "stop" and held.usage.completion_tokens == 6 and EOS_ID not in held.output_ids[:5]
    with torch.no_grad():
        logits = oracle.model(torch.tensor([prompt_ids])).logits[0, -1].float()
    # logprobs stay the model's own (raw), before any adjustment, as vLLM reports them by default
    assert raw.logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1)[77]), abs=1e-4)


def test_sampled_requests_with_penalties_are_reproducible_by_seed(server):
    with Client(server.port, timeout_s=60) as c:
        runs = [c.generate(PROMPT, max_tokens=16, ignore_eos=True, temperature=0.9, seed=7, presence_penalty=1.0,
                           repetition_penalty=1.2, logit_bias={"5": -100.0}).output_ids for _ in range(2)]
    assert runs[0] == runs[1] and 5 not in runs[0]


def test_penalty_values_are_checked(server):
    from zserve.client import InvalidRequestError

    with Client(server.port, timeout_s=30) as c:
        for kwargs, needle in [
            ({"presence_penalty": 3.0}, r"presence_penalty must be in \[-2, 2\]"),
            ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 10\]"),
            ({"logit_bias": {"abc": 1.0}}, "logit_bias keys must be token ids"),
            ({"logit_bias": {"99999": 1.0}}, "not in the vocabulary"),
            ({"logit_bias": {"5": 500.0}}, r"logit_bias\[5\] must be in \[-100, 100\]"),
            ({"min_tokens": 10, "max_tokens": 5}, r"min_tokens \(10\) must be at most max_tokens \(5\)"),
        ]:
            with pytest.raises(InvalidRequestError, match=needle):
                c.generate("hi", **kwargs)
