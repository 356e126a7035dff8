"""The real demo model (SmolLM2-135M-Instruct, `zserve-fetch-demo`) through ModelRunner, against
transformers on the same directory: greedy token ids identical on real chat prompts, batched
together the way the scheduler would batch them; the France answer says Paris; and a seeded
sampled request draws the same tokens alone and inside a batch of other requests.

scripts/test.sh fetches the model before running the tests; without it these skip.
"""

from __future__ import annotations

import numpy as np
import pytest

from common.forward_batch import SamplingArrays
from model_proc.demo_model import demo_model_dir, missing_files
from tests.model_fixtures import GreedyDriver, HfReference, Seq

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_files(demo_model_dir())),
        reason=f"demo model not at {demo_model_dir()}: run .venv/bin/zserve-fetch-demo (scripts/test.sh does)",
    ),
]

FRANCE = "What is the capital of France?"
QUESTIONS = (FRANCE, "Write a haiku about the sea.", "Give me three tips for learning to program.")
NEW_TOKENS = 32  # EOS ignored on both sides, so every answer has exactly this many tokens
SAMPLED_TOKENS = 6


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_dir())


@pytest.fixture(scope="module")
def chat_prompts(tokenizer) -> list[list[int]]:
    prompts = []
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


@pytest.fixture(scope="module")
def runner():
    from model_proc.model_runner import ModelRunner

    return ModelRunner(demo_model_dir(), device="cpu", page_size=16, kv_cache_tokens=2048)


@pytest.fixture(scope="module")
def ours(runner, chat_prompts) -> list[list[int]]:
    """Greedy answers through ModelRunner, all prompts in one batch (prefill, then decode)."""
    driver = GreedyDriver(runner)
    return driver.generate([driver.add(p, NEW_TOKENS) for p in chat_prompts])


def test_greedy_matches_transformers_generate(ours, chat_prompts, tokenizer):
    reference = HfReference(demo_model_dir())
    for question, prompt, answer in zip(QUESTIONS, chat_prompts, ours, strict=True):
        expected = reference.generate(prompt, NEW_TOKENS)
        assert answer == expected, (
            f"{question!r}\n ours: {tokenizer.decode(answer)!r}\n transformers: {tokenizer.decode(expected)!r}"
        )


def test_france_answer_says_paris(ours, tokenizer):
    answer = tokenizer.decode(ours[QUESTIONS.index(FRANCE)], skip_special_tokens=True)
    assert "Paris" in answer, answer


class _SampledDriver(GreedyDriver):
    """GreedyDriver whose batches carry each Seq's own sampling row instead of greedy ones."""

    def __init__(self, runner, rows: dict[int, tuple[float, int, float, float, int]]):
        super().__init__(runner)
        self.rows = rows  # id(seq) -> (temperature, top_k, top_p, min_p, seed)

    def build_batch(self, seqs: list[Seq]):
        batch = super().build_batch(seqs)
        t, k, p, m, s = zip(*(self.rows[id(seq)] for seq in seqs), strict=True)
        batch.sampling = SamplingArrays(
            np.array(t, np.float32), np.array(k, np.int32), np.array(p, np.float32), np.array(m, np.float32), np.array(s, np.int64)
        )
        return batch


def test_seeded_sampling_is_the_same_alone_and_batched(runner, chat_prompts):
    france_row = (0.9, 40, 0.95, 0.02, 20240601)
    others = [(1.2, 0, 0.9, 0.0, 7), (0.0, 0, 1.0, 0.0, 0)]  # a sampled and a greedy neighbour

    def run(prompts_and_rows):
        driver = _SampledDriver(runner, {})
        seqs = []
        for prompt, row in prompts_and_rows:
            seq = driver.add(prompt, SAMPLED_TOKENS)
            driver.rows[id(seq)] = row
            seqs.append(seq)
        return driver.generate(seqs)

    alone = run([(chat_prompts[0], france_row)])[0]
    batched = run([(chat_prompts[1], others[0]), (chat_prompts[0], france_row), (chat_prompts[2], others[1])])[1]
    assert alone == batched
