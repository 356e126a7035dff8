"""PageAllocator, RadixCache and CacheManager with exact expectations."""

import numpy as np
import pytest

from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.page_allocator import PageAllocator
from zserve.scheduler_proc.radix_cache import RadixCache
from zserve.scheduler_proc.req import Req


def ids(*xs):
    return np.array(xs, np.int32)


def test_allocator_hands_out_lowest_pages_then_most_recently_freed():
    a = PageAllocator(num_pages=6, page_size=4)
    assert a.alloc(3).tolist() == [0, 1, 2]
    assert a.alloc(2).tolist() == [3, 4]
    a.free(ids(1, 3))
    assert a.num_free_pages == 3
    assert a.alloc(2).tolist() == [1, 3]
    assert a.alloc(2) is None  # only page 5 is left
    assert a.alloc(1).tolist() == [5]
    a.check_integrity()


def test_allocator_double_free_is_caught():
    a = PageAllocator(num_pages=3, page_size=1)
    a.alloc(2)
    a.free(ids(0))
    a.free(ids(0))  # page 0 again: the free list now holds it twice
    with pytest.raises(AssertionError, match="double free"):
        a.check_integrity()


def test_match_returns_whole_pages_and_splits_the_node():
    t = RadixCache(page_size=2)
    t.insert(ids(1, 2, 3, 4, 5, 6, 7, 8), ids(10, 11, 12, 13))
    m = t.match_prefix(ids(1, 2, 3, 4, 5, 9))  # mismatch inside the third page
    assert m.num_tokens == 4 and m.page_ids.tolist() == [10, 11]
    assert m.node.token_ids.tolist() == [1, 2, 3, 4]  # split: the node covers exactly the match
    assert [n.token_ids.tolist() for n in m.node.children.values()] == [[5, 6, 7, 8]]
    assert t.match_prefix(ids(1, 2, 3)).page_ids.tolist() == [10]  # a partial last page never matches
    assert t.match_prefix(ids(2, 1)).num_tokens == 0
    assert t.num_pages == 4 and t.num_evictable_pages == 4
    t.check_integrity()


def test_insert_reports_existing_pages_as_the_trees():
    t = RadixCache(page_size=1)
    t.insert(ids(1, 2, 3), ids(7, 8, 9))
    m = t.insert(ids(1, 2, 4, 5), ids(20, 21, 22, 23))  # 1,2 exist: the tree keeps 7,8
    assert m.page_ids.tolist() == [7, 8, 22, 23]
    assert t.num_pages == 5
    assert sorted(t.check_integrity().tolist()) == [7, 8, 9, 22, 23]


def test_lru_eviction_order_and_locked_nodes_survive():
    t = RadixCache(page_size=1)
    a = t.insert(ids(1, 1), ids(0, 1)).node
    b = t.insert(ids(2, 2), ids(2, 3)).node
    t.insert(ids(3, 3), ids(4, 5))
    t.match_prefix(ids(1, 1))  # touch a: now b is the least recently used
    t.lock(b)
    assert t.num_evictable_pages == 4
    assert t.evict(1).tolist() == [4, 5]  # c (b is locked); a whole leaf goes
    assert t.evict(1).tolist() == [0, 1]  # a
    assert t.evict(5).tolist() == []  # only locked b is left
    assert t.num_pages == 2 and t.num_evictable_pages == 0
    t.unlock(b)
    assert t.num_evictable_pages == 2 and t.evict(2).tolist() == [2, 3]
    assert a.parent is None and t.num_pages == 0  # evicted nodes are detached


def test_eviction_climbs_to_a_parent_left_childless():
    t = RadixCache(page_size=1)
    t.insert(ids(1, 2), ids(0, 1))
    t.insert(ids(1, 3), ids(0, 2))  # splits: [1] -> {[2], [3]}
    t.insert(ids(9), ids(3))
    assert t.evict(4).tolist() == [1, 2, 0, 3]  # leaves oldest first, then the parent they left, then [9]


def test_split_keeps_a_lock_handle_valid():
    t = RadixCache(page_size=1)
    node = t.insert(ids(1, 2, 3, 4), ids(0, 1, 2, 3)).node
    t.lock(node)
    upper = t.match_prefix(ids(1, 2, 9)).node  # splits `node` after 2 tokens
    assert upper.lock_count == 1 and node.lock_count == 1 and node.parent is upper
    assert t.path_page_ids(node).tolist() == [0, 1, 2, 3]
    t.unlock(node)
    assert upper.lock_count == 0 and t.num_evictable_pages == 4
    t.check_integrity()


def _req(cache: CacheManager, req_id: int, tokens, row_idx: int) -> Req:
    """A request that computed `tokens` itself (no prefix hit), its pages fresh from the pool."""
    n = -(-len(tokens) // cache.page_size)
    page_table = np.zeros(n + 1, np.int32)
    page_table[:n] = cache.alloc(n)
    return Req(req_id, np.array(tokens, np.int32), len(tokens), len(tokens), SamplingParams(), 1, 0, frozenset(), row_idx, page_table,
               num_pages=n, num_tree_pages=0, cache_node=cache.tree.root, cached_len=len(tokens), num_cached_tokens=0, admit_seq=req_id)


def test_duplicate_prefix_is_freed_only_after_the_page_table_points_at_the_shared_copy():
    cache = CacheManager(num_pages=8, page_size=2, enable_radix_cache=True)
    a = _req(cache, 1, [5, 6, 7, 8, 9], row_idx=0)  # pages 0,1,2 (2 is partial)
    b = _req(cache, 2, [5, 6, 7, 8, 9], row_idx=1)  # the same prompt computed again: pages 3,4,5
    cache.cache_req(a)
    assert a.num_tree_pages == 2 and cache.num_free_pages == 2
    freed = []
    free = cache.allocator.free
    cache.allocator.free = lambda p: (freed.append((np.asarray(p).tolist(), b.page_table[:2].tolist())), free(p))
    cache.cache_req(b)
    # b's pages 3,4 duplicate a's 0,1: when they were freed, b already read 0,1
    assert freed == [([3, 4], [0, 1])]
    assert b.page_table[:3].tolist() == [0, 1, 5] and b.num_tree_pages == 2 and b.cache_node is a.cache_node
    assert a.cache_node.lock_count == 2
    cache.check_integrity([a, b])
    cache.release_req(a)
    cache.release_req(b)
    cache.check_integrity([])
    assert cache.num_cached_pages == 2 and cache.num_evictable_pages == 2 and cache.num_free_pages == 6


def test_alloc_evicts_lru_when_the_free_list_runs_short():
    cache = CacheManager(num_pages=4, page_size=1, enable_radix_cache=True)
    for i, tokens in enumerate(([1, 2], [3, 4])):
        r = _req(cache, i, tokens, row_idx=i)
        cache.release_req(r)  # both prompts cached, unlocked
    assert cache.num_free_pages == 0 and cache.num_evictable_pages == 4
    assert cache.alloc(1).tolist() == [0]  # evicts [1, 2] (older), pages 0 and 1
    assert cache.num_free_pages == 1 and cache.num_cached_pages == 2


def test_integrity_names_a_leaked_page():
    cache = CacheManager(num_pages=4, page_size=1, enable_radix_cache=True)
    cache.alloc(1)
    with pytest.raises(AssertionError, match=r"pages \[0\] are neither free"):
        cache.check_integrity([])


def test_disabled_cache_frees_everything_at_the_end():
    cache = CacheManager(num_pages=4, page_size=2, enable_radix_cache=False)
    r = _req(cache, 1, [1, 2, 3, 4, 5], row_idx=0)
    cache.cache_req(r)
    assert r.num_tree_pages == 0
    assert cache.match_prefix(np.array([1, 2, 3, 4, 5], np.int32), 4).num_tokens == 0
    cache.release_req(r)
    assert cache.num_free_pages == 4 and cache.num_cached_pages == 0
