"""CUDA graphs for decode (model_proc/cuda_graphs.py): the buckets and the bucket a batch takes, the eager fallback,
the static buffers a batch is copied into (padding rows on the scratch page, the real rows sliced back), on the CPU;
the static-buffer metadata against the eager forward under Triton's interpreter; capture and replay only on CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.model_fixtures import make_runner
from testing.paged_batches import shuffled_page_batch
from zserve.common.config_sections import KernelSection
from zserve.common.forward_batch import PromptLogprobRows
from zserve.model_proc.cuda_graph_buckets import CudaGraphBuckets
from zserve.model_proc.cuda_graph_inputs import CudaGraphInputs, host_arrays
from zserve.model_proc.cuda_graphs import CudaGraphs, unsupported_reason
from zserve.model_proc.layers.attention_metadata import AttentionMetadata

CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="capture and replay need CUDA (none here)")
PAGE_SIZE, NUM_PAGES = 4, 40
SCRATCH_PAGE = NUM_PAGES - 1


def decode_batch(cached: list[int], *, seed: int = 0, num_pages: int = NUM_PAGES - 1, page_size: int = PAGE_SIZE):
    """Plain decode rows over shuffled pages (never the scratch page), token ids 1, 2, ..."""
    batch = shuffled_page_batch(np.random.default_rng(seed), cached, [1] * len(cached), page_size, num_pages)
    batch.input_ids = np.arange(1, len(cached) + 1, dtype=np.int32)
    return batch


def test_buckets_are_sglangs():
    assert CudaGraphBuckets.up_to(160).sizes == (1, 2, 4, *range(8, 161, 8))
    assert CudaGraphBuckets.up_to(1).sizes == (1,)
    assert CudaGraphBuckets.up_to(3).sizes == (1, 2, 3)
    assert CudaGraphBuckets.up_to(12).sizes == (1, 2, 4, 8, 12)  # the largest itself, when not a multiple of 8
    with pytest.raises(ValueError, match="cuda-graph-max-bs"):
        CudaGraphBuckets.up_to(0)


def test_the_smallest_bucket_that_holds_the_rows():
    buckets = CudaGraphBuckets.up_to(32)
    assert [buckets.size_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 32)] == [1, 2, 4, 4, 8, 8, 16, 24, 32]
    assert buckets.size_for(33) is None
    assert buckets.choose(decode_batch([3, 5, 9])) == 4
    assert CudaGraphBuckets.up_to(2).choose(decode_batch([3, 5, 9])) is None  # too large: eager


def test_steps_that_are_not_a_plain_decode_run_eagerly():
    buckets = CudaGraphBuckets.up_to(8)
    prefill = shuffled_page_batch(np.random.default_rng(0), [0, 4], [5, 1], PAGE_SIZE, 10)
    first_token = decode_batch([0, 3])  # extend 1 with nothing cached: a 1-token prompt
    sharing = decode_batch([3, 3])
    sharing.kv_source = np.array([0, 0], np.int32)
    drafted = decode_batch([3, 5])
    drafted.draft_lens = np.zeros(2, np.int32)
    echo = decode_batch([3, 5])
    echo.prompt_logprobs = PromptLogprobRows(rows=np.array([0], np.int32), next_ids=np.array([-1], np.int32), num_top=0)
    pooled = decode_batch([3, 5])
    pooled.pooling = "last"
    for batch in (prefill, first_token, sharing, drafted, echo, pooled):
        assert buckets.choose(batch) is None
    assert CudaGraphBuckets(()).choose(decode_batch([3])) is None  # graphs turned off after a failed capture


def test_host_arrays_pad_to_the_bucket_on_the_scratch_page():
    batch = decode_batch([3, 4, 9])  # positions 3, 4, 9: mid-page, a page's first slot, a third page
    padded = host_arrays(batch, 8, 5, PAGE_SIZE, SCRATCH_PAGE)
    eager = AttentionMetadata.build(batch, _pool(), torch.float32, backend="triton")
    assert padded.input_ids.tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    assert padded.positions.tolist() == [3, 4, 9, 0, 0, 0, 0, 0]
    assert padded.seq_lens.tolist() == [4, 5, 10, 1, 1, 1, 1, 1]
    assert padded.cached_lens.dtype == np.int32 and padded.cached_lens.tolist() == padded.positions.tolist()
    assert padded.out_slots[:3].tolist() == eager.out_slots.tolist()  # where the eager forward writes
    assert padded.out_slots[3:].tolist() == [SCRATCH_PAGE * PAGE_SIZE] * 5
    table = padded.page_ids.reshape(8, 5)
    starts = np.cumsum(batch.num_pages) - batch.num_pages
    for row, (start, count) in enumerate(zip(starts, batch.num_pages, strict=True)):
        assert table[row, :count].tolist() == batch.page_ids[start : start + count].tolist()
        assert (table[row, count:] == SCRATCH_PAGE).all()
    assert (table[3:] == SCRATCH_PAGE).all()
    assert SCRATCH_PAGE not in batch.page_ids


def test_host_arrays_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="bucket of 2"):
        host_arrays(decode_batch([3, 4, 9]), 2, 5, PAGE_SIZE, SCRATCH_PAGE)
    with pytest.raises(ValueError, match="2 pages"):
        host_arrays(decode_batch([3, 4, 9]), 4, 2, PAGE_SIZE, SCRATCH_PAGE)


def test_fill_copies_into_the_static_buffers_and_rows_of_drops_the_padding():
    inputs = CudaGraphInputs(4, 5, PAGE_SIZE, SCRATCH_PAGE, torch.device("cpu"))  # CPU tensors stand in for CUDA's
    addresses = [t.data_ptr() for t in (inputs.input_ids, inputs.out_slots, inputs.page_ids)]
    for cached in ([3, 4, 9], [7]):  # a second batch into the same bucket: the same buffers, new values
        batch = decode_batch(cached, seed=len(cached))
        inputs.fill(batch)
        padded = host_arrays(batch, 4, 5, PAGE_SIZE, SCRATCH_PAGE)
        for name in ("input_ids", "positions", "out_slots", "seq_lens", "cached_lens", "page_ids"):
            assert getattr(inputs, name).tolist() == getattr(padded, name).tolist(), name
    assert [t.data_ptr() for t in (inputs.input_ids, inputs.out_slots, inputs.page_ids)] == addresses
    meta = inputs.metadata(_pool())
    assert meta.positions is inputs.positions and meta.triton.page_ids is inputs.page_ids
    assert meta.triton.decode_reqs.tolist() == [0, 1, 2, 3] and meta.triton.page_starts.tolist() == [0, 5, 10, 15]
    logits = torch.arange(4 * 3).reshape(4, 3)
    assert CudaGraphInputs.rows_of(logits, 1).tolist() == [[0, 1, 2]]
    inputs.fill_padding()
    assert inputs.out_slots.tolist() == [SCRATCH_PAGE * PAGE_SIZE] * 4 and inputs.input_ids.tolist() == [0] * 4


def test_graphs_run_only_on_cuda_with_triton_and_one_rank():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    on = KernelSection()
    assert unsupported_reason(on, cuda, "triton", 1) == ""
    assert "disable-cuda-graph" in unsupported_reason(KernelSection(disable_cuda_graph=True), cuda, "triton", 1)
    assert "cpu" in unsupported_reason(on, cpu, "triton", 1)
    assert "torch" in unsupported_reason(on, cuda, "torch", 1)
    assert "flash_varlen" in unsupported_reason(on, cuda, "flash_varlen", 1)
    assert "tp_size=2" in unsupported_reason(on, cuda, "triton", 2)


def test_a_cpu_runner_has_no_graphs_and_gives_out_every_page(llama_dir):
    runner = make_runner(llama_dir, device="cpu", page_size=4, kv_cache_tokens=64, cuda_graph_max_bs=8)
    assert runner.cuda_graphs is None
    assert runner.num_pages_total == runner.kv_pool.num_pages


def test_the_static_buffers_compute_the_eager_logits(llama_dir):
    """The graph's forward over the static buffers (no capture: Triton's interpreter on the CPU) against the
    eager forward: the real rows' logits equal, the padding rows wrote only the scratch page."""
    triton = pytest.importorskip("triton", reason="the triton package is not installed")
    if type(triton.language.standard.cdiv).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it)")
    runner = make_runner(llama_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE, kv_cache_tokens=NUM_PAGES * PAGE_SIZE,
                         attention_backend="triton")  # fmt: skip
    pool = runner.kv_pool
    scratch = pool.num_pages - 1
    gen = torch.Generator().manual_seed(0)
    for cache in (*pool.k, *pool.v):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    batch = decode_batch([3, 4, 9], num_pages=scratch)
    eager = runner.last_logits(batch)
    kept = [c[:, : scratch * PAGE_SIZE].clone() for c in pool.k]
    graphs = CudaGraphs(runner.model, pool, CudaGraphBuckets.up_to(8), max_pages=8)
    inputs = CudaGraphInputs(4, 8, PAGE_SIZE, scratch, pool.device)
    inputs.fill(batch)
    with torch.inference_mode():
        logits, hidden = graphs._step(inputs, inputs.metadata(pool))
    assert logits.shape[0] == hidden.shape[0] == 4
    torch.testing.assert_close(CudaGraphInputs.rows_of(logits, 3), eager, atol=1e-4, rtol=1e-4)
    for before, cache in zip(kept, pool.k, strict=True):  # the real rows rewrote their own slots alike
        assert torch.equal(before, cache[:, : scratch * PAGE_SIZE])


@CUDA_ONLY
def test_capture_and_replay_match_the_eager_forward(llama_dir):
    runner = make_runner(llama_dir, device="cuda", dtype="float32", page_size=16, kv_cache_tokens=4096,
                         attention_backend="triton", cuda_graph_max_bs=16)  # fmt: skip
    graphs = runner.cuda_graphs
    assert graphs is not None and runner.num_pages_total == runner.kv_pool.num_pages - 1
    for cached, seed in (([3, 17, 40], 0), ([5, 90, 2, 33, 64], 1), ([8], 2)):  # buckets 4, 8, 1; 4 replayed below
        batch = decode_batch(cached, seed=seed, num_pages=runner.num_pages_total, page_size=16)
        replayed = graphs.run(batch)
        assert replayed is not None
        logits = replayed[0].clone()
        runner.cuda_graphs = None
        eager = runner.last_logits(batch)
        runner.cuda_graphs = graphs
        torch.testing.assert_close(logits, eager, atol=1e-3, rtol=1e-3)
    assert sorted(graphs.graphs) == [1, 4, 8]
    again = decode_batch([11, 12, 13], seed=3, num_pages=runner.num_pages_total, page_size=16)
    result = runner.run(again)  # through the runner's hook, sampled eagerly
    assert result.next_token_ids.shape == (3,)


def _pool():
    from zserve.model_proc.layers.kv_pool import KVPool

    return KVPool(1, 1, 4, PAGE_SIZE, NUM_PAGES, torch.float32, torch.device("cpu"))
