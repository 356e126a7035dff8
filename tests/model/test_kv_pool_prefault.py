"""KVPool.prefault: the first huge page of each head's slots is resident before any request, values unchanged."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from testing.model_fixtures import make_runner
from zserve.model_proc.layers.kv_pool import HUGE_PAGE_BYTES, OS_PAGE_BYTES, KVPool


def resident_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor`'s memory in RAM: its 4 KiB pages present, from /proc/self/pagemap (bit 63 of each
    page's 8-byte entry). Per tensor: the kernel merges the pool's neighbouring mappings into one, so a
    mapping's Rss in /proc/self/smaps would count the other tensors too."""
    first, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first_page, end_page = first // OS_PAGE_BYTES, -(-end // OS_PAGE_BYTES)
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first_page * 8)
        entries = np.frombuffer(pagemap.read((end_page - first_page) * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum()) * OS_PAGE_BYTES


@pytest.mark.skipif(not Path("/proc/self/pagemap").is_file(), reason="needs /proc/self/pagemap (Linux)")
def test_prefault_makes_the_first_slots_of_every_head_resident():
    # 2 layers, 2 heads of 8 MiB each (65536 slots x 64 x bf16): a huge page's worth (16384 slots) per head
    pool = KVPool(2, 2, 64, 16, 4096, torch.bfloat16, torch.device("cpu"))
    bytes_per_head = pool.num_slots * 64 * 2
    assert all(resident_bytes(t) == 0 for t in (*pool.k, *pool.v))  # mapped lazily
    touched = pool.prefault()
    assert touched == 2 * 2 * 2 * HUGE_PAGE_BYTES
    for cache in (*pool.k, *pool.v):
        # each head's first 2 MiB (one huge page, two where its start is not aligned, or 4 KiB pages), never the rest
        assert 2 * HUGE_PAGE_BYTES <= resident_bytes(cache) <= 2 * 2 * HUGE_PAGE_BYTES < 2 * bytes_per_head
        assert not cache.any()  # zeros written over zeros


def test_prefault_of_a_small_pool_covers_it_all():
    pool = KVPool(1, 2, 16, 4, 8, torch.float32, torch.device("cpu"))  # 32 slots of 64 bytes a head
    assert pool.prefault() == pool.num_bytes
    assert not pool.k[0].any() and not pool.v[0].any()


def test_runner_reports_its_start_phases(llama_dir, caplog):
    """The worker's start timeline: ModelRunner marks each step (the pool sized in tokens exists before the
    weights load; one sized by memory after them), and the pool is prefaulted either way."""
    from zserve.common.start_phases import StartPhases

    for tokens in (64, 0):
        phases = StartPhases()
        with caplog.at_level(logging.INFO, logger="zserve.model_proc.model_runner"):
            runner = make_runner(llama_dir, device="cpu", page_size=4, kv_cache_tokens=tokens,
                                 kv_memory_fraction=0.001, start_phases=phases)
        assert list(phases.durations_s) == ["model config", "model build", "kernel choice", "packed cache read", "checkpoint open",
                                            "load and pack", "KV pool (the rest of its prefault)",
                                            "attention and sampler"]
        assert runner.kv_pool.num_pages == (16 if tokens else runner.kv_pool.num_pages)
        assert resident_bytes(runner.kv_pool.k[0]) > 0
