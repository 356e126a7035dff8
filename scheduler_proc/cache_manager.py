"""CacheManager: who holds each KV page -- the free list, the radix cache, or one request.

Every page is in exactly one of three places (check_integrity proves it):
  - free: on the PageAllocator's free list;
  - tree: held by a RadixCache node (shared; locked while a request reads it, else evictable);
  - own: in one live request's page table after its tree-owned prefix.
Pages move free -> own (alloc), own -> tree (cache_req), tree -> free (evict), own -> free
(a request's end, or a duplicate of what the tree already had).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np

from zserve.common.int_math import cdiv
from zserve.common.lora_modules import NO_ADAPTER
from zserve.scheduler_proc.page_allocator import PageAllocator
from zserve.scheduler_proc.radix_cache import PrefixMatch, RadixCache, RadixNode
from zserve.scheduler_proc.req import Req


def cache_namespace(lora_idx: int) -> int:
    """The radix tree's namespace of K/V computed by the LoRA adapter `lora_idx` (0: the base model's)."""
    return lora_idx + 1


class CacheManager:
    def __init__(
        self, num_pages: int, page_size: int, enable_radix_cache: bool,
        on_pages_freed: Callable[[np.ndarray], None] | None = None,
    ):
        """`on_pages_freed` sees every page id array just before it goes back on the free list (the
        test harness poisons those pages, so a later read of them fails)."""
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_radix_cache = enable_radix_cache
        self.allocator = PageAllocator(num_pages, page_size)
        self.tree = RadixCache(page_size)  # stays empty when the cache is disabled
        self.on_pages_freed = on_pages_freed

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free_pages

    @property
    def num_evictable_pages(self) -> int:
        return self.tree.num_evictable_pages

    @property
    def num_cached_pages(self) -> int:
        return self.tree.num_pages

    @property
    def num_available_pages(self) -> int:
        """Pages an allocation can get now: free ones plus unlocked cached ones (by eviction)."""
        return self.allocator.num_free_pages + self.tree.num_evictable_pages

    def match_prefix(self, input_ids: np.ndarray, max_num_tokens: int, lora_idx: int = NO_ADAPTER) -> PrefixMatch:
        """The cached prefix of at most `max_num_tokens` tokens (whole pages) computed by the LoRA adapter
        `lora_idx` (or the base model). Not locked yet."""
        if not self.enable_radix_cache or max_num_tokens < self.page_size:
            return PrefixMatch(self.tree.root, np.zeros(0, np.int32), 0)
        return self.tree.match_prefix(input_ids[: max_num_tokens - max_num_tokens % self.page_size],
                                      cache_namespace(lora_idx))

    def lock(self, node: RadixNode) -> None:
        self.tree.lock(node)

    def unlock(self, node: RadixNode) -> None:
        self.tree.unlock(node)

    def alloc(self, num_pages: int) -> np.ndarray:
        """`num_pages` pages, evicting LRU cache leaves if the free list runs short. The caller has
        reserved them (admission promised them), so running out is a bookkeeping bug."""
        pages = self.try_alloc(num_pages)
        assert pages is not None, f"out of KV pages: need {num_pages}, {self.num_available_pages} free or evictable"
        return pages

    def try_alloc(self, num_pages: int, num_keep_pages: int = 0) -> np.ndarray | None:
        """`num_pages` pages as `alloc` gets them, or None (nothing taken, nothing evicted) unless
        `num_keep_pages` more would still be free or evictable after."""
        if num_pages + num_keep_pages > self.num_available_pages:
            return None
        pages = self.allocator.alloc(num_pages)
        if pages is None:
            self._free(self.tree.evict(num_pages - self.allocator.num_free_pages))
            pages = self.allocator.alloc(num_pages)
        return pages

    def cache_req(self, req: Req) -> None:
        """Hand the request's full pages of computed tokens to the tree; the request keeps
        reading them through a lock. Runs after each prefill chunk and at the request's end.

        If another request cached the same tokens meanwhile, the tree keeps its copy: this
        request's page table is repointed at the shared pages *before* its duplicates are
        freed, so no request ever reads a freed page.
        """
        num_full_pages = req.cached_len // self.page_size
        if not self.enable_radix_cache or num_full_pages <= req.num_tree_pages:
            return
        token_ids = req.token_ids(num_full_pages * self.page_size)
        match = self.tree.insert(token_ids, req.page_table[:num_full_pages], cache_namespace(req.lora_idx))
        old = req.num_tree_pages
        assert np.array_equal(match.page_ids[:old], req.page_table[:old]), (
            f"request {req.req_id}: its locked prefix changed pages"
        )
        own_pages = req.page_table[old:num_full_pages]
        duplicates = own_pages[own_pages != match.page_ids[old:]]  # a copy (boolean index)
        self.tree.lock(match.node)
        self.tree.unlock(req.cache_node)
        req.page_table[:num_full_pages] = match.page_ids  # repoint first ...
        req.cache_node = match.node
        req.num_tree_pages = num_full_pages
        self._free(duplicates)  # ... then free

    def trim_req(self, req: Req) -> None:
        """After a step with speculative drafts: the request's own pages wholly past its computed
        tokens (`cached_len`; the K/V of rejected drafts there is garbage) go back to the free list.
        A partly used last page stays: the request overwrites its rejected slots next step."""
        num_pages = cdiv(req.cached_len, self.page_size)
        assert num_pages >= req.num_tree_pages, f"request {req.req_id}: trimming into its tree-owned pages"
        if num_pages < req.num_pages:
            self._free(req.page_table[num_pages : req.num_pages].copy())
            req.num_pages = num_pages

    def release_req(self, req: Req) -> None:
        """A request's end: cache what it computed, free its own pages, drop its lock."""
        self.cache_req(req)
        self._free(req.page_table[req.num_tree_pages : req.num_pages])
        self.tree.unlock(req.cache_node)
        req.cache_node = self.tree.root
        req.num_pages = req.num_tree_pages = 0

    def _free(self, page_ids: np.ndarray) -> None:
        if self.on_pages_freed is not None:
            self.on_pages_freed(page_ids)
        self.allocator.free(page_ids)

    def check_integrity(self, reqs: Iterable[Req]) -> None:
        """Every page is free, held by the tree, or owned by exactly one of `reqs` (the live
        requests); every tree lock is accounted for by a request reading that prefix."""
        self.allocator.check_integrity()
        tree_pages = self.tree.check_integrity()
        reqs = list(reqs)
        held = [self.allocator.free_page_ids(), tree_pages]
        expected_locks: Counter[int] = Counter()
        for req in reqs:
            assert 0 <= req.num_tree_pages <= req.num_pages <= req.max_num_pages, (
                f"request {req.req_id}: tree pages {req.num_tree_pages}, pages {req.num_pages}, max {req.max_num_pages}"
            )
            path = self.tree.path_page_ids(req.cache_node)
            assert np.array_equal(path, req.page_table[: req.num_tree_pages]), (
                f"request {req.req_id} reads tree pages not on its locked path"
            )
            held.append(req.page_table[req.num_tree_pages : req.num_pages])
            node = req.cache_node
            while node is not self.tree.root:
                expected_locks[node.node_id] += 1
                node = node.parent
        for node in self.tree.nodes():
            assert node.lock_count == expected_locks[node.node_id], (
                f"tree node {node.node_id} has {node.lock_count} locks, {expected_locks[node.node_id]} requests read it"
            )
        pages = np.concatenate(held)
        counts = np.bincount(pages, minlength=self.num_pages)
        assert len(counts) == self.num_pages, f"page id {int(pages.max())} is outside the pool of {self.num_pages}"
        lost, shared = np.flatnonzero(counts == 0), np.flatnonzero(counts > 1)
        assert lost.size == 0, f"pages {lost[:8].tolist()} are neither free, cached, nor held by a request (leaked)"
        assert shared.size == 0, f"pages {shared[:8].tolist()} have more than one owner (free/tree/request)"
