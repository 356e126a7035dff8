"""LoRA adapters in the scheduler: each row's adapter travels in ForwardBatch.lora_ids, and K/V computed under one
adapter is never read by a request of another (nor of the base model): not through the radix cache, not through
KV sharing of identical prompts admitted together. The harness checks every token and the pages' integrity."""

from __future__ import annotations

import numpy as np

from testing.fake_model import FakeModel
from testing.scheduler_harness import SchedulerHarness
from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.radix_cache import RadixCache

NAMES = ("sql", "chat")
PROMPT = list(range(3, 3 + 21))  # 5 full pages of 4 and one token


def harness(**knobs) -> SchedulerHarness:
    return SchedulerHarness(FakeModel(256, 4), context_len=128, eos_token_ids=[], lora_names=NAMES, **knobs)


def params(lora_path: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=3, ignore_eos=True, lora_path=lora_path)


def pages_of(batch, row: int) -> set[int]:
    start = int(batch.num_pages[:row].sum())
    return set(batch.page_ids[start : start + int(batch.num_pages[row])].tolist())


def test_the_same_prompt_under_two_adapters_and_none_never_shares_pages():
    h = harness()
    for req_id, name in enumerate((None, "sql", "chat", "sql")):
        h.submit(req_id, PROMPT, params(name))
    h.step()
    [batch] = h.batches
    assert batch.lora_ids.tolist() == [-1, 0, 1, 0]
    # only the second "sql" request shares K/V, and with the first "sql" one
    assert batch.kv_source is not None and batch.kv_source.tolist() == [0, 1, 2, 1]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not pages_of(batch, a) & pages_of(batch, b), (a, b)
    h.run()
    h.assert_drained()
    # cached now under each of the three; a new request hits its own adapter's prefix only
    for req_id, name in ((10, "chat"), (11, None)):
        h.submit(req_id, PROMPT + [99], params(name))
        h.step()
        batch = h.batches[-1]
        assert batch.cached_lens.tolist() == [20]
        h.run()
    tree_pages = [set(h.scheduler._cache.tree.path_page_ids(node).tolist()) for node in h.scheduler._cache.tree.root.children.values()]
    assert len(tree_pages) == 3 and not (tree_pages[0] & tree_pages[1]) and not (tree_pages[1] & tree_pages[2])


def test_a_server_without_adapters_sends_no_lora_ids():
    h = SchedulerHarness(FakeModel(64, 4), context_len=128, eos_token_ids=[])
    h.submit(0, PROMPT, SamplingParams(max_tokens=2, ignore_eos=True))
    h.run()
    assert all(b.lora_ids is None for b in h.batches)


def test_an_unknown_adapter_is_refused_by_the_scheduler_too():
    h = harness()
    [update] = h.submit(0, PROMPT, params("nope"))
    assert "'nope' does not exist" in update.error


def test_the_radix_tree_keeps_namespaces_apart_through_splits_and_eviction():
    tree = RadixCache(page_size=2)
    tokens = np.arange(8, dtype=np.int32)
    tree.insert(tokens, np.array([0, 1, 2, 3], np.int32))
    tree.insert(tokens, np.array([4, 5, 6, 7], np.int32), namespace=1)
    assert tree.match_prefix(tokens[:4], namespace=2).num_tokens == 0
    assert tree.match_prefix(tokens[:4], namespace=1).page_ids.tolist() == [4, 5]  # splits namespace 1's node
    assert tree.match_prefix(tokens, namespace=0).page_ids.tolist() == [0, 1, 2, 3]
    tree.check_integrity()
    assert sorted(tree.evict(8).tolist()) == list(range(8))
    tree.check_integrity()
    assert not tree.root.children
