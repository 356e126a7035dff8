"""An embedding server's scheduler (Scheduler(pooling=...)): prompts only, chunked by the token budget,
each chunk's vector folded per the pooling mode, one final update carrying the embedding and no token;
the prefix cache is off and every page is free afterwards, also after an abort between chunks."""

from __future__ import annotations

import numpy as np
import pytest

from testing.scheduler_harness import make_scheduler
from zserve.common.finish_reason import FinishReason
from zserve.common.forward_batch import NO_TOKEN, ForwardBatch, StepResult
from zserve.common.pooling import Pooling
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.req import Req

NUM_PAGES, PAGE_SIZE = 32, 4
PROMPTS = {1: list(range(3, 8)), 2: list(range(10, 30)), 3: list(range(40, 49))}


def features(token_ids: np.ndarray) -> np.ndarray:
    """float32[n, 3]: a stand-in for the final hidden states, different at every position."""
    t = token_ids.astype(np.float32)
    return np.stack([t, t * t, np.ones_like(t)], axis=1)


def fake_worker(batch: ForwardBatch) -> StepResult:
    """Each row's chunk vector as ModelRunner's chunk_pooler gives it, from `features`."""
    vectors = []
    for start, n in zip(batch.token_starts().tolist(), batch.extend_lens.tolist(), strict=True):
        chunk = features(batch.input_ids[start : start + n])
        vectors.append({"mean": chunk.sum(0), "last": chunk[-1], "cls": chunk[0]}[batch.pooling])
    num_reqs = batch.num_reqs
    return StepResult(step_id=batch.step_id, next_token_ids=np.full(num_reqs, NO_TOKEN, np.int32),
                      logprobs=np.full(num_reqs, np.nan, np.float32), pooled=np.concatenate(vectors).astype(np.float32))


def expected(prompt: list[int], mode: str) -> np.ndarray:
    f = features(np.array(prompt))
    return {"mean": f.mean(0), "last": f[-1], "cls": f[0]}[mode]


@pytest.mark.parametrize("mode", ["mean", "last", "cls"])
def test_chunked_prompts_pool_to_one_final_update_each(mode):
    scheduler = make_scheduler(num_pages=NUM_PAGES, page_size=PAGE_SIZE, context_len=64, eos_token_ids=[0],
                               max_prefill_tokens=8, pooling=Pooling(mode, normalize=False))
    for req_id, prompt in PROMPTS.items():
        assert scheduler.submit(req_id, prompt, SamplingParams(max_tokens=1)) == []
    finals, num_steps = {}, 0
    while (batch := scheduler.next_batch()) is not None:
        num_steps += 1
        assert batch.pooling == mode and (batch.cached_lens + batch.extend_lens <= 64).all()
        for out in scheduler.on_result(fake_worker(batch)):
            assert out.req_id not in finals and out.finish_reason is FinishReason.STOP and len(out.token_ids) == 0
            finals[out.req_id] = out.embedding
        scheduler.check_integrity()
    assert num_steps >= 34 // 8  # the budget chunked the prompts
    for req_id, prompt in PROMPTS.items():
        assert np.allclose(finals[req_id], expected(prompt, mode), rtol=1e-6), req_id
    stats = scheduler.stats()
    assert stats.num_free_pages == NUM_PAGES and stats.num_cached_pages == 0 and stats.num_finished == 3


def test_normalised_and_an_abort_between_chunks_frees_everything():
    scheduler = make_scheduler(num_pages=NUM_PAGES, page_size=PAGE_SIZE, context_len=64, eos_token_ids=[0],
                               max_prefill_tokens=8, pooling=Pooling("mean", normalize=True))
    scheduler.submit(2, PROMPTS[2], SamplingParams(max_tokens=1))
    scheduler.submit(1, PROMPTS[1], SamplingParams(max_tokens=1))
    first = scheduler.next_batch()
    assert first.extend_lens[0] < len(PROMPTS[2])  # request 2's first chunk
    outs = scheduler.on_result(fake_worker(first))
    assert [o.finish_reason for o in scheduler.abort(2)] == [FinishReason.ABORT]
    while (batch := scheduler.next_batch()) is not None:
        outs += scheduler.on_result(fake_worker(batch))
        scheduler.check_integrity()
    assert [o.req_id for o in outs] == [1]
    want = expected(PROMPTS[1], "mean")
    assert np.allclose(outs[0].embedding, want / np.linalg.norm(want), rtol=1e-6)
    assert scheduler.stats().num_free_pages == NUM_PAGES


def test_an_abort_while_in_flight_sends_no_embedding_and_frees_its_pages():
    scheduler = make_scheduler(num_pages=NUM_PAGES, page_size=PAGE_SIZE, context_len=64, eos_token_ids=[0],
                               max_prefill_tokens=64, pooling=Pooling("last", normalize=True))
    scheduler.submit(3, PROMPTS[3], SamplingParams(max_tokens=1))
    batch = scheduler.next_batch()
    assert len(scheduler.abort(3)) == 1
    assert scheduler.on_result(fake_worker(batch)) == []
    scheduler.check_integrity()
    assert scheduler.stats().num_free_pages == NUM_PAGES and not scheduler.has_work


def test_the_integrity_check_finds_a_pooled_vector_on_a_generating_server():
    scheduler = make_scheduler(num_pages=NUM_PAGES, page_size=PAGE_SIZE, context_len=64, eos_token_ids=[0],
                               max_prefill_tokens=8)
    scheduler.submit(1, PROMPTS[1], SamplingParams(max_tokens=4))
    batch = scheduler.next_batch()
    assert batch.pooling is None  # the owner is off: the worker samples
    [req] = [r for r in scheduler._live.values() if isinstance(r, Req)]
    req.pooled = np.zeros(4, np.float32)
    with pytest.raises(AssertionError, match="holds a pooled vector unpooled"):
        scheduler.check_integrity()
