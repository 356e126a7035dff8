"""The CPU paged-attention kernel (model_proc/kernels/) against a naive reference and against the
pure-torch path, and its fallback when it cannot be built.

Tolerances: fp32 within 1e-5 (the kernel's exp is ~2 ulp, sums in another order); bf16 within
2e-2 absolute + 2e-2 relative of an fp32 reference on the same bf16 inputs: the output is
rounded to bf16 (a relative step of 2^-8) after fp32 accumulation, and the torch path also rounds
its scores and probabilities to bf16 on the way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from testing.paged_batches import shuffled_page_batch
from zserve.common.forward_batch import ForwardBatch
from zserve.model_proc.kernels import cpu_kernels
from zserve.model_proc.layers.attention import attention_backend
from zserve.model_proc.layers.attention_metadata import AttentionMetadata
from zserve.model_proc.layers.kv_pool import KVPool

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture(scope="module")
def op():
    loaded = cpu_kernels.load_paged_attention()
    if loaded is None:
        pytest.skip("the CPU paged-attention kernel did not build on this machine (the fallback tests below still run)")
    return loaded


def random_batch(rng, cached_lens, extend_lens, page_size, num_pages_spare=7) -> ForwardBatch:
    """Requests owning pages of a pool, handed out in a random order."""
    num_needed = sum(-(-(c + e) // page_size) for c, e in zip(cached_lens, extend_lens, strict=True))
    return shuffled_page_batch(rng, cached_lens, extend_lens, page_size, num_needed + num_pages_spare)


def naive_attention(
    q, k_cache, v_cache, batch: ForwardBatch, page_size: int, scale: float, window: int = 0, softcap: float = 0.0
) -> torch.Tensor:
    """fp32, one request at a time, slot by slot: softmax(q k^T * scale + causal mask) v; with
    `window` W, query position p sees keys p - W + 1 .. p; with `softcap` c, scores s -> c tanh(s / c)."""
    T, h, d = q.shape
    group = h // k_cache.shape[0]
    out = torch.zeros(T, h, d)
    token_start = page_start = 0
    for c, e, n in zip(batch.cached_lens.tolist(), batch.extend_lens.tolist(), batch.num_pages.tolist(), strict=True):
        pos = torch.arange(c + e)
        pages = torch.from_numpy(batch.page_ids[page_start : page_start + n].astype(np.int64))
        slots = pages[pos // page_size] * page_size + pos % page_size
        keys = k_cache[:, slots].float().repeat_interleave(group, 0)  # [h, L, d]
        values = v_cache[:, slots].float().repeat_interleave(group, 0)
        queries = q[token_start : token_start + e].float().transpose(0, 1)  # [h, E, d]
        scores = queries @ keys.transpose(1, 2) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        query_pos = torch.arange(c, c + e)[:, None]
        scores.masked_fill_(pos[None, :] > query_pos, float("-inf"))
        if window:
            scores.masked_fill_(pos[None, :] <= query_pos - window, float("-inf"))
        out[token_start : token_start + e] = (scores.softmax(-1) @ values).transpose(0, 1)
        token_start, page_start = token_start + e, page_start + n
    return out


def run_kernel(
    op, q, k_cache, v_cache, batch: ForwardBatch, page_size: int, scale: float, window: int = 0, softcap: float = 0.0
) -> torch.Tensor:
    extend = batch.extend_lens.astype(np.int64)
    index = [torch.from_numpy(a.astype(np.int64)) for a in (np.cumsum(extend) - extend, extend, batch.cached_lens)]
    page_starts = torch.from_numpy((np.cumsum(batch.num_pages) - batch.num_pages).astype(np.int64))
    out = torch.full_like(q, float("nan"))
    page_ids = torch.from_numpy(batch.page_ids.astype(np.int64))
    op(q, k_cache, v_cache, out, *index, page_starts, page_ids, page_size, scale, window, softcap)
    return out


def random_inputs(batch: ForwardBatch, num_heads, num_kv_heads, head_dim, page_size, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_slots = (int(batch.page_ids.max()) + 1) * page_size
    k_cache, v_cache = (torch.randn(num_kv_heads, num_slots, head_dim, generator=gen).to(dtype) for _ in range(2))
    q = (torch.randn(batch.num_tokens, num_heads, head_dim, generator=gen) * 2).to(dtype)  # * 2: peakier softmax
    return q, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_decode_against_naive(op, page_size, group, head_dim, dtype):
    """Decode rows at lengths 1..300, page boundaries included (cached = k * page_size - 1, k *
    page_size, k * page_size + 1), in one call."""
    rng = np.random.default_rng(page_size * 100 + group * 10 + head_dim)
    lens = sorted({0, 1, 2, 15, 16, 17, 63, 64, 65, 299, *rng.integers(0, 300, 6).tolist()})
    batch = random_batch(rng, lens, [1] * len(lens), page_size)
    q, k_cache, v_cache = random_inputs(batch, 2 * group, 2, head_dim, page_size, dtype)
    scale = head_dim**-0.5
    got = run_kernel(op, q, k_cache, v_cache, batch, page_size, scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), naive_attention(q, k_cache, v_cache, batch, page_size, scale), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_extend_with_cached_prefix_against_naive(op, page_size, dtype):
    """Rows of several new tokens after a cached prefix (row i sees positions <= cached + i), new
    prompts, 1-token prompts and decodes, mixed in one call; extends longer than a query block (16)
    and than a key tile (64)."""
    rng = np.random.default_rng(page_size)
    cached = [0, 0, 5, 16, 31, 100, 0, 200, 7]
    extend = [1, 40, 3, 17, 33, 1, 130, 70, 1]
    batch = random_batch(rng, cached, extend, page_size)
    q, k_cache, v_cache = random_inputs(batch, 9, 3, 64, page_size, dtype, seed=page_size)
    got = run_kernel(op, q, k_cache, v_cache, batch, page_size, 0.125)
    torch.testing.assert_close(got.float(), naive_attention(q, k_cache, v_cache, batch, page_size, 0.125), **TOLERANCE[dtype])


def test_non_contiguous_queries(op):
    """q as the model hands it over: a view into a wider projection output (head_dim contiguous)."""
    rng = np.random.default_rng(3)
    batch = random_batch(rng, [0, 9, 40], [5, 1, 2], 4)
    qkv = torch.randn(batch.num_tokens, 9 + 2 * 3, 64)
    q, k_cache, v_cache = qkv[:, :9], torch.randn(3, 64 * 4, 64), torch.randn(3, 64 * 4, 64)
    assert not q.is_contiguous()
    got = run_kernel(op, q, k_cache, v_cache, batch, 4, 0.125)
    torch.testing.assert_close(got, naive_attention(q, k_cache, v_cache, batch, 4, 0.125), **TOLERANCE[torch.float32])


def test_rejects_page_ids_outside_the_pool(op):
    batch = random_batch(np.random.default_rng(0), [10], [1], 4)
    q, k_cache, v_cache = random_inputs(batch, 3, 1, 64, 4, torch.float32)
    batch.page_ids = batch.page_ids.copy()
    batch.page_ids[1] = 10_000
    with pytest.raises(RuntimeError, match="outside the pool"):
        run_kernel(op, q, k_cache, v_cache, batch, 4, 0.125)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_layer_matches_the_torch_path(op, page_size, dtype):
    """PagedAttention.forward on the kernel backend against the pure-torch backend (the oracle)
    for a mixed batch: K/V writes, decode, chunks after a cached prefix, new prompts."""
    from zserve.model_proc.layers.attention import PagedAttention

    rng = np.random.default_rng(11)
    cached, extend = [12, 0, 33, 64, 0, 150], [1, 20, 1, 9, 1, 1]
    batch = random_batch(rng, cached, extend, page_size)
    num_pages = int(batch.page_ids.max()) + 1
    attn = PagedAttention(9, 3, 64, 0.125, layer_idx=0)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch.num_tokens, 9, 64, generator=gen).to(dtype)
    k, v = (torch.randn(batch.num_tokens, 3, 64, generator=gen).to(dtype) for _ in range(2))
    outs = []
    for backend in ("cpu_kernel", "torch"):
        pool = KVPool(1, 3, 64, page_size, num_pages, dtype, torch.device("cpu"))
        fill = torch.Generator().manual_seed(6)
        pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=fill)), pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=fill))
        with torch.inference_mode():
            outs.append(attn(q, k, v, AttentionMetadata.build(batch, pool, dtype, backend=backend)).float())
    torch.testing.assert_close(outs[0], outs[1], **TOLERANCE[dtype])


def test_backend_choice():
    cpu = torch.device("cpu")
    assert attention_backend(cpu, torch.float32, "torch") == "torch"
    assert attention_backend(cpu, torch.float16, "auto") == "torch"  # the kernel runs fp32 and bf16 only
    with pytest.raises(ValueError, match="expected one of auto, torch, kernel, triton"):
        attention_backend(cpu, torch.float32, "fast")
    with pytest.raises(ValueError, match="float32/bfloat16"):
        attention_backend(cpu, torch.float16, "kernel")


def test_fallback_when_the_build_fails(monkeypatch, caplog):
    """A failing build logs one line, and auto picks the torch path; `kernel` refuses to start."""

    def failing_build(verbose: bool = False):
        raise RuntimeError("Error building extension 'zserve_cpu_kernels'\nc++: not found")

    monkeypatch.setattr(cpu_kernels, "build", failing_build)
    cpu_kernels.load_cpu_kernels.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert attention_backend(torch.device("cpu"), torch.float32, "auto") == "torch"
            assert attention_backend(torch.device("cpu"), torch.bfloat16, "auto") == "torch"
        warnings = [r.getMessage() for r in caplog.records if "CPU kernels unavailable" in r.getMessage()]
        assert warnings == ["CPU kernels unavailable (c++: not found); using the pure-torch attention path and oneDNN linear layers"]
        with pytest.raises(RuntimeError, match="could not be built"):
            attention_backend(torch.device("cpu"), torch.float32, "kernel")
    finally:
        cpu_kernels.load_cpu_kernels.cache_clear()


def test_fallback_without_a_compiler(tmp_path, llama_dir):
    """A fresh process on a machine where nothing compiles (no compiler, empty build cache): the
    runner starts on the torch path and serves a step."""
    script = textwrap.dedent(f"""
        import logging
        import numpy as np
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        from testing.model_fixtures import make_runner
        from zserve.common.forward_batch import ForwardBatch, SamplingArrays
        runner = make_runner({str(llama_dir)!r}, device="cpu", page_size=4, kv_cache_tokens=64)
        print("backend", runner.attention_backend)
        batch = ForwardBatch(0, np.array([1, 2, 3], np.int32), np.zeros(1, np.int32), np.array([3], np.int32),
                             np.array([0], np.int32), np.array([1], np.int32), np.ones(1, bool), np.zeros(1, bool),
                             SamplingArrays.greedy(1))
        print("tokens", runner.run(batch).next_token_ids.tolist())
    """)
    env = {**os.environ, "CXX": "/nonexistent/c++", "ZSERVE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "ZSERVE_ATTENTION": "auto"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "backend torch" in proc.stdout and "tokens [" in proc.stdout
    assert proc.stderr.count("CPU kernels unavailable") == 1, proc.stderr


def test_the_window_reference_masks_what_it_should():
    """The reference's window: position p sees exactly p - W + 1 .. p (transformers' `kv_idx > q_idx - W`)."""
    batch = random_batch(np.random.default_rng(0), [0], [6], 4)
    q, k_cache, v_cache = random_inputs(batch, 1, 1, 8, 4, torch.float32)
    slots = torch.from_numpy(batch.page_ids.astype(np.int64)).repeat_interleave(4) * 4 + torch.arange(4).repeat(2)
    v_cache[0, slots[:6]] = torch.eye(8)[:6]  # value j is one-hot at j: the output's row is the weight of each key
    weights = naive_attention(q, k_cache, v_cache, batch, 4, 0.5, window=3)[:, 0, :6]
    assert ((weights > 0) == (torch.arange(6)[None] > torch.arange(6)[:, None] - 3) & (torch.arange(6)[None] <= torch.arange(6)[:, None])).all()


WINDOW_CASES = {  # name -> (cached_lens, extend_lens): decodes and prefills around and far past the window
    "decode": ([0, 3, 15, 16, 17, 40, 100, 299], [1] * 8),
    "prefill": ([0, 0, 5, 16, 31, 100, 7, 200], [1, 40, 3, 17, 33, 1, 130, 70]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 5, 16, 33, 1000])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_sliding_window_against_naive(op, case, page_size, window, dtype):
    """Windows smaller than a page, than a query block, than a key tile, and larger than every
    context (the same as none); GQA (3 query heads per kv head), head_dim 64 (compiled) or 40 (generic)."""
    cached, extend = WINDOW_CASES[case]
    head_dim = 64 if window % 2 else 40
    batch = random_batch(np.random.default_rng(page_size + window), cached, extend, page_size)
    q, k_cache, v_cache = random_inputs(batch, 6, 2, head_dim, page_size, dtype, seed=window)
    got = run_kernel(op, q, k_cache, v_cache, batch, page_size, 0.125, window=window)
    want = naive_attention(q, k_cache, v_cache, batch, page_size, 0.125, window=window)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])
    if window < 100:  # the window does mask something here: full attention differs
        assert not torch.allclose(want, naive_attention(q, k_cache, v_cache, batch, page_size, 0.125), atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 7])
def test_logit_softcap_against_naive(op, window, dtype):
    """Scores c * tanh(s / c) after the scale (Gemma 2's attention soft-capping), with and without a window."""
    cached, extend = WINDOW_CASES["prefill"]
    batch = random_batch(np.random.default_rng(5), cached, extend, 4)
    q, k_cache, v_cache = random_inputs(batch, 8, 2, 64, 4, dtype, seed=9)
    q = q * 4  # scores of tens: the cap (5) bends them a lot
    got = run_kernel(op, q, k_cache, v_cache, batch, 4, 0.125, window=window, softcap=5.0)
    want = naive_attention(q, k_cache, v_cache, batch, 4, 0.125, window=window, softcap=5.0)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])
    assert not torch.allclose(want, naive_attention(q, k_cache, v_cache, batch, 4, 0.125, window=window), atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, softcap", [(5, 0.0), (20, 0.0), (0, 5.0), (6, 5.0)])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_window_and_softcap_layer_paths_against_naive(op, page_size, window, softcap, dtype):
    """PagedAttention with a window and/or a soft-cap on each backend (the torch path's decode
    rows, new prompts and cached-prefix rows, and the kernel) against the reference, one mixed batch."""
    from zserve.model_proc.layers.attention import PagedAttention

    rng = np.random.default_rng(page_size)
    cached, extend = [12, 0, 33, 64, 0, 150, 3], [1, 20, 1, 9, 1, 1, 30]
    batch = random_batch(rng, cached, extend, page_size)
    num_pages = int(batch.page_ids.max()) + 1
    attn = PagedAttention(8, 2, 64, 0.125, layer_idx=0, sliding_window=window, logit_softcap=softcap)
    gen = torch.Generator().manual_seed(5)
    q = (torch.randn(batch.num_tokens, 8, 64, generator=gen) * 3).to(dtype)
    k, v = (torch.randn(batch.num_tokens, 2, 64, generator=gen).to(dtype) for _ in range(2))
    for backend in ("cpu_kernel", "torch"):
        pool = KVPool(1, 2, 64, page_size, num_pages, dtype, torch.device("cpu"))
        fill = torch.Generator().manual_seed(6)
        pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=fill)), pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=fill))
        with torch.inference_mode():
            got = attn(q, k, v, AttentionMetadata.build(batch, pool, dtype, backend=backend)).float()
            want = naive_attention(q, pool.k[0], pool.v[0], batch, page_size, 0.125, window=window, softcap=softcap)
        # the torch path caps bf16 scores, as transformers' eager attention does: scores of tens lose ~0.1
        tolerance = {"atol": 5e-2, "rtol": 5e-2} if softcap and dtype == torch.bfloat16 and backend == "torch" else TOLERANCE[dtype]
        torch.testing.assert_close(got.view(want.shape), want, **tolerance, msg=lambda m, b=backend: f"{b}: {m}")


def test_negative_window_or_softcap_is_refused():
    from zserve.model_proc.layers.attention import PagedAttention

    with pytest.raises(ValueError, match="must be >= 0"):
        PagedAttention(4, 2, 64, 0.125, 0, sliding_window=-1)


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (5, 0.0), (0, 5.0), (6, 5.0)])
def test_flash_varlen_arguments_follow_its_convention(monkeypatch, window, softcap):
    """The flash-attn path (CUDA only) on CPU through a stand-in written from flash-attn's documented
    window_size / softcap contract (testing/fake_flash_attn.py): the same outputs as the reference."""
    from testing import fake_flash_attn
    from zserve.model_proc.layers.attention import PagedAttention

    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn)
    batch = random_batch(np.random.default_rng(2), [12, 0, 33, 3], [1, 20, 9, 30], 4)
    attn = PagedAttention(8, 2, 64, 0.125, layer_idx=0, sliding_window=window, logit_softcap=softcap)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch.num_tokens, 8, 64, generator=gen) * 3
    k, v = (torch.randn(batch.num_tokens, 2, 64, generator=gen) for _ in range(2))
    pool = KVPool(1, 2, 64, 4, int(batch.page_ids.max()) + 1, torch.float32, torch.device("cpu"))
    pool.k[0].normal_(generator=gen), pool.v[0].normal_(generator=gen)
    got = attn(q, k, v, AttentionMetadata.build(batch, pool, torch.float32, backend="flash_varlen"))
    want = naive_attention(q, pool.k[0], pool.v[0], batch, 4, 0.125, window=window, softcap=softcap)
    torch.testing.assert_close(got.view(want.shape), want, **TOLERANCE[torch.float32])
