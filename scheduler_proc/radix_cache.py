"""RadixCache: a radix tree from token-id prefixes to the KV pages that hold their K/V.

The tree holds whole pages only: every edge is a multiple of `page_size` tokens, and a node's
`page_ids[i]` holds tokens `token_ids[i * page_size : (i + 1) * page_size]` of its edge.
Children are keyed by the bytes of their first page of tokens, so a lookup costs one dict hit
per node and one vectorised compare per edge.

Namespaces: K/V computed under one LoRA adapter is not the K/V of the same tokens under another (or
under the base model), so each adapter's prefixes live in a subtree of their own. A child of the root is
keyed by its namespace too (`namespace` 0 is the base model's, keyed as before); deeper keys need
none, as a node's namespace is its top node's. A lookup in one namespace never reaches another's pages.

Locks: a request that reads a prefix from the tree holds a lock on the node where its prefix
ends; `lock` counts +1 on that node and every ancestor. A node with `lock_count > 0` is never
evicted; pages of unlocked nodes are "evictable" (still valid, reclaimable on demand).
Eviction removes unlocked leaves, least recently used first; a parent left childless and
unlocked becomes a candidate in turn. Candidates live in a lazy heap: an entry is pushed whenever
a node becomes an unlocked leaf or is touched while one, and entries that no longer describe
their node (evicted, locked, grown children, touched since) are skipped when popped. So eviction
costs O(log n) per node evicted, not a walk over the tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, np.int32)
_EMPTY.setflags(write=False)


@dataclass(eq=False, slots=True)
class RadixNode:
    token_ids: np.ndarray  # int32[num_pages * page_size]: the edge from the parent
    page_ids: np.ndarray  # int32[num_pages]
    parent: RadixNode | None
    node_id: int  # creation order; breaks LRU ties so eviction order is deterministic
    children: dict[bytes, RadixNode] = field(default_factory=dict)
    lock_count: int = 0
    last_access: int = 0
    namespace: int = 0  # whose K/V: 0 the base model's, 1 + i LoRA adapter i's

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)


@dataclass(slots=True)
class PrefixMatch:
    """The tree's pages for a prefix of `num_tokens` tokens, ending at `node`. `page_ids` may be
    a view of the tree's own array: copy it, never write to it."""

    node: RadixNode
    page_ids: np.ndarray  # int32[num_tokens // page_size]
    num_tokens: int


class RadixCache:
    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = RadixNode(_EMPTY, _EMPTY, None, node_id=0)
        self._num_pages = 0  # pages held by the tree
        self._num_evictable_pages = 0  # pages held by unlocked nodes
        self._clock = 0  # logical time of the last access, for LRU
        self._num_nodes_made = 1
        self._num_nodes = 0  # in the tree, root excluded
        self._leaf_heap: list[tuple[int, int, RadixNode]] = []  # (last_access, node_id, node), lazy

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_evictable_pages(self) -> int:
        return self._num_evictable_pages

    def match_prefix(self, token_ids: np.ndarray, namespace: int = 0) -> PrefixMatch:
        """The longest page-aligned prefix of `token_ids` in the tree (in `namespace`). Splits a node the
        prefix ends inside of, so the returned node covers exactly the match (and can be locked alone)."""
        node, pages, num_tokens = self._walk(token_ids, namespace)
        return PrefixMatch(node, _concat(pages), num_tokens)

    def insert(self, token_ids: np.ndarray, page_ids: np.ndarray, namespace: int = 0) -> PrefixMatch:
        """Make the tree hold `token_ids` (a whole number of pages), adding `page_ids` for the part
        it lacks. Returns the tree's pages for the whole range: where they differ from `page_ids`
        the tree already had those tokens and the caller's pages are duplicates (the caller
        repoints its page table first, then frees them)."""
        ps = self.page_size
        assert len(token_ids) % ps == 0 and len(page_ids) * ps == len(token_ids), (len(token_ids), len(page_ids), ps)
        node, pages, num_tokens = self._walk(token_ids, namespace)
        if num_tokens < len(token_ids):
            leaf = self._new_node(token_ids[num_tokens:].copy(), page_ids[num_tokens // ps :].copy(), node, namespace)
            node.children[self._key(leaf)] = leaf
            self._num_pages += leaf.num_pages
            self._num_evictable_pages += leaf.num_pages
            self._num_nodes += 1
            self._push_if_evictable(leaf)
            pages.append(leaf.page_ids)
            node = leaf
        return PrefixMatch(node, _concat(pages), len(token_ids))

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_count == 0:
                self._num_evictable_pages -= node.num_pages
            node.lock_count += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        self._unlock_path(node)
        self._push_if_evictable(node)  # only the bottom of a locked path can be a leaf

    def _unlock_path(self, node: RadixNode) -> None:
        while node is not self.root:
            assert node.lock_count > 0, f"unlock of node {node.node_id} that holds no lock"
            node.lock_count -= 1
            if node.lock_count == 0:
                self._num_evictable_pages += node.num_pages
            node = node.parent

    def evict(self, num_pages: int) -> np.ndarray:
        """Remove unlocked leaves, least recently used first, until at least `num_pages` pages
        are released (or nothing evictable is left). Returns the released page ids."""
        released: list[np.ndarray] = []
        num_released = 0
        heap = self._leaf_heap
        while heap and num_released < num_pages:
            last_access, _, node = heapq.heappop(heap)
            if node.parent is None or not self._is_evictable_leaf(node) or node.last_access != last_access:
                continue  # stale: evicted, locked, has children now, or touched since
            parent = node.parent
            del parent.children[self._key(node)]
            node.parent = None  # marks it evicted
            released.append(node.page_ids)
            num_released += node.num_pages
            self._num_pages -= node.num_pages
            self._num_evictable_pages -= node.num_pages
            self._num_nodes -= 1
            self._push_if_evictable(parent)
        return _concat(released)

    def path_page_ids(self, node: RadixNode) -> np.ndarray:
        """Pages from the root down to `node`, in token order."""
        pages = []
        while node is not self.root:
            pages.append(node.page_ids)
            node = node.parent
        return _concat(pages[::-1])

    def nodes(self) -> Iterator[RadixNode]:
        """Every node but the root."""
        return (n for n in self._nodes() if n is not self.root)

    def check_integrity(self) -> np.ndarray:
        """Check the tree's own invariants; return every page it holds."""
        ps = self.page_size
        all_pages = []
        num_evictable = 0
        for node in self.nodes():
            assert node.num_pages >= 1 and len(node.token_ids) == node.num_pages * ps, (
                f"node {node.node_id} edge is not whole pages"
            )
            assert node.parent.children.get(self._key(node)) is node, (
                f"node {node.node_id} is not its parent's child"
            )
            assert node.lock_count >= 0, f"node {node.node_id} lock_count {node.lock_count}"
            child_locks = sum(c.lock_count for c in node.children.values())
            assert node.lock_count >= child_locks, f"node {node.node_id} holds fewer locks than its children"
            all_pages.append(node.page_ids)
            num_evictable += node.num_pages if node.lock_count == 0 else 0
        pages = _concat(all_pages)
        assert len(pages) == self._num_pages, f"tree counts {self._num_pages} pages, holds {len(pages)}"
        assert num_evictable == self._num_evictable_pages, (
            f"tree counts {self._num_evictable_pages} evictable pages, has {num_evictable}"
        )
        assert len(pages) == 0 or np.bincount(pages).max() <= 1, "a page is held by two tree nodes"
        assert self._num_nodes == sum(1 for _ in self.nodes()), "tree node count is off"
        queued = {(a, n.node_id) for a, _, n in self._leaf_heap if n.parent is not None}
        for node in self.nodes():
            if self._is_evictable_leaf(node):
                assert (node.last_access, node.node_id) in queued, (
                    f"evictable leaf {node.node_id} is not in the eviction heap"
                )
        return pages

    # -- internals ---------------------------------------------------------------------------

    def _key(self, node: RadixNode) -> bytes:
        """`node`'s key in its parent's children."""
        return _child_key(node.token_ids[: self.page_size], node.namespace if node.parent is self.root else 0)

    def _walk(self, token_ids: np.ndarray, namespace: int) -> tuple[RadixNode, list[np.ndarray], int]:
        """Follow `token_ids` down the tree (in `namespace`) in whole pages, splitting the node it ends
        inside of. Touches every node on the path (LRU)."""
        ps = self.page_size
        self._clock += 1
        node, pages, pos = self.root, [], 0
        while pos + ps <= len(token_ids):
            child = node.children.get(_child_key(token_ids[pos : pos + ps], namespace if pos == 0 else 0))
            if child is None:
                break
            n = _common_prefix_len(child.token_ids, token_ids[pos:])
            n -= n % ps  # >= ps: the first page matched through the dict key
            if n < len(child.token_ids):
                child = self._split(child, n)
            child.last_access = self._clock
            pages.append(child.page_ids)
            pos += n
            node = child
        self._push_if_evictable(node)  # touched: its heap entry (if a leaf) is stale now
        return node, pages, pos

    def _split(self, node: RadixNode, num_tokens: int) -> RadixNode:
        """Cut `node`'s edge after `num_tokens`; the new upper node takes the head. `node` keeps
        its identity (a lock handle on it stays valid and still covers the same tokens)."""
        ps = self.page_size
        upper = self._new_node(
            node.token_ids[:num_tokens], node.page_ids[: num_tokens // ps], node.parent, node.namespace,
        )
        upper.lock_count = node.lock_count
        upper.last_access = node.last_access
        self._num_nodes += 1
        node.parent.children[self._key(upper)] = upper
        node.token_ids = node.token_ids[num_tokens:]
        node.page_ids = node.page_ids[num_tokens // ps :]
        node.parent = upper
        upper.children[self._key(node)] = node
        return upper

    def _new_node(self, token_ids: np.ndarray, page_ids: np.ndarray, parent: RadixNode, namespace: int) -> RadixNode:
        node = RadixNode(
            token_ids, page_ids, parent, node_id=self._num_nodes_made, last_access=self._clock, namespace=namespace,
        )
        self._num_nodes_made += 1
        return node

    def _is_evictable_leaf(self, node: RadixNode) -> bool:
        return node is not self.root and not node.children and node.lock_count == 0

    def _push_if_evictable(self, node: RadixNode) -> None:
        if not self._is_evictable_leaf(node):
            return
        heapq.heappush(self._leaf_heap, (node.last_access, node.node_id, node))
        if len(self._leaf_heap) > 4 * self._num_nodes + 1024:  # mostly stale: rebuild
            self._leaf_heap = [(n.last_access, n.node_id, n) for n in self.nodes() if self._is_evictable_leaf(n)]
            heapq.heapify(self._leaf_heap)

    def _nodes(self) -> Iterator[RadixNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _child_key(first_page: np.ndarray, namespace: int) -> bytes:
    """A child's key: the bytes of its first page, after the namespace for a top node of an adapter's subtree
    (5 more bytes: never the length of a page's bytes, a multiple of 4, so never the base model's key)."""
    key = first_page.tobytes()
    return key if namespace == 0 else b"L" + namespace.to_bytes(4, "little") + key


def _common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    if not arrays:
        return _EMPTY
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays)
