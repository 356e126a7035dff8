"""How many pages the model worker's paged KV pool holds (the cache section: --page-size,
--kv-cache-tokens, --kv-memory-fraction, --mem-fraction-static, --kv-cache-dtype).

Sized in tokens (--kv-cache-tokens > 0), the pool exists before the weights load, so its first pages
are faulted in while they do; sized by memory, it waits for the weights and takes a share of what they
leave: --kv-memory-fraction of the memory free after loading, or, when --mem-fraction-static > 0, that
share of the device's whole memory less the weights (SGLang's meaning). With several ranks every pool
takes the smallest rank's page count: the scheduler's page ids index all of them. Sized by memory, an int8 cache
(--kv-cache-dtype int8: d + 2 bytes a row against 2 d) gets 2d / (d + 2) times the pages of a 16-bit one, an fp8
one (d bytes a row) twice them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zserve.common.config_sections import CacheSection
from zserve.model_proc.layers.kv_pool import KVPool
from zserve.model_proc.tp_group import min_across_ranks


@dataclass(frozen=True)
class KVPoolSizing:
    cache: CacheSection
    num_layers: int
    kv_heads: int  # this rank's share of the model's KV heads
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.cache.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.cache.page_size}")

    def before_weights(self) -> KVPool | None:
        """The pool sized in tokens (--kv-cache-tokens > 0); None when it is sized by memory, after the weights."""
        if self.cache.kv_cache_tokens <= 0:
            return None
        return self._pool(KVPool.num_pages_for(self.cache.kv_cache_tokens, self.cache.page_size))

    def after_weights(self, model: torch.nn.Module) -> KVPool:
        """The pool sized by memory, the weights of `model` loaded: a share of what is free."""
        cache, page_size = self.cache, self.cache.page_size
        per_token = KVPool.bytes_per_token(
            self.num_layers, self.kv_heads, self.head_dim, self.dtype, self.cache.kv_cache_dtype
        )
        if cache.mem_fraction_static > 0:
            weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
            num_pages = KVPool.num_pages_for_static_share(
                cache.mem_fraction_static, self.device, weight_bytes, per_token, page_size
            )
        else:
            num_pages = KVPool.num_pages_for_memory(cache.kv_memory_fraction, self.device, per_token, page_size)
        if self.tp_size > 1:  # the scheduler's page ids index every rank's pool: all take the smallest
            num_pages = min_across_ranks(num_pages, self.device)
        return self._pool(num_pages)

    def _pool(self, num_pages: int) -> KVPool:
        return KVPool(self.num_layers, self.kv_heads, self.head_dim, self.cache.page_size, num_pages, self.dtype,
                      self.device, self.cache.kv_cache_dtype)
