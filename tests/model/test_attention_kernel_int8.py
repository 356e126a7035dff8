"""The int8 KV cache (--kv-cache-dtype int8) on the CPU: the kernel that reads it in place
(zserve::paged_attention_int8), the fused rope/store that writes it (rope_store_int8), KVPool's
writes, copies and reads, and its page count; then this file again at every lower instruction set
this CPU runs (ZSERVE_CPU_ISA: a build each).

Tolerances: a token decoding alone (one new token) in a build with AVX512-VNNI and head_dim 64 or 128
is scored with its query rounded to int8 (int8_decode_instruction; kernels/int8_attention.h): against
testing/int8_attention_reference.py, that arithmetic in torch, within fp32 rounding. Every other row,
against the 16-bit kernel over the dequantized cache (fp32 rows q * scale, the products the int8
kernel forms), is bit for bit the same in fp32; bf16 queries against an fp32 reference over the
dequantized cache within test_attention_kernel.py's bf16 bound. Against the unquantized cache the
int8 rounding moves each K/V value by at most max|row| / 254 (and a decode query's by max|q| / 254):
on these random rows (|x| up to ~4, scores of q * 2) the output moves by at most INT8_BOUND.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from testing.int8_attention_reference import int8_decode_reference
from testing.paged_batches import shuffled_page_batch
from zserve.common.forward_batch import ForwardBatch
from zserve.common.isa_features import IsaFeatures
from zserve.model_proc.kernels import cpu_kernels
from zserve.model_proc.kernels.cpu_isa import cpu_isa, int8_decode_instruction
from zserve.model_proc.layers.kv_int8 import SCALE_DTYPE, dequantize_rows, quantize_rows
from zserve.model_proc.layers.kv_pool import KVPool
from zserve.model_proc.layers.rotary import RotaryEmbedding, apply_rotary

BF16_TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}
# max |int8-cache output - unquantized-cache output| on these inputs (outputs ~1): measured 0.070 with fp32 queries,
# 0.099 with a decode token's queries in int8
INT8_BOUND = 0.15
REFERENCE_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}  # the int8 decode walk against its torch reference, fp32


@pytest.fixture(scope="module")
def ops():
    if not cpu_kernels.load_cpu_kernels():
        pytest.skip("the CPU kernels did not build on this machine")
    return torch.ops.zserve


def random_batch(rng, cached_lens, extend_lens, page_size) -> ForwardBatch:
    num_needed = sum(-(-(c + e) // page_size) for c, e in zip(cached_lens, extend_lens, strict=True))
    return shuffled_page_batch(rng, cached_lens, extend_lens, page_size, num_needed + 5)


def index_of(batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
    starts = torch.from_numpy((np.cumsum(batch.extend_lens) - batch.extend_lens).astype(np.int64))
    page_starts = torch.from_numpy((np.cumsum(batch.num_pages) - batch.num_pages).astype(np.int64))
    return (starts, torch.from_numpy(batch.extend_lens.astype(np.int64)), torch.from_numpy(batch.cached_lens.astype(np.int64)),
            page_starts, torch.from_numpy(batch.page_ids.astype(np.int64)))


def attend(ops, q, caches, batch, page_size, window=0, softcap=0.0, scale=0.125) -> torch.Tensor:
    """caches: (k, v) of q's dtype, or (k_int8, v_int8, k_scales, v_scales)."""
    out = torch.full_like(q, float("nan"))
    options = (page_size, scale, window, softcap)
    if len(caches) == 4:
        k, v, ks, vs = caches
        ops.paged_attention_int8(q, k, v, ks, vs, out, *index_of(batch), *options)
    else:
        ops.paged_attention(q, *caches, out, *index_of(batch), *options)
    return out


def random_caches(batch, num_heads, num_kv_heads, head_dim, page_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_slots = (int(batch.page_ids.max()) + 1) * page_size
    k, v = (torch.randn(num_kv_heads, num_slots, head_dim, generator=gen) for _ in range(2))
    q = torch.randn(batch.num_tokens, num_heads, head_dim, generator=gen) * 2  # * 2: peakier softmax
    (kq, ks), (vq, vs) = quantize_rows(k), quantize_rows(v)
    return q, (k, v), (kq, vq, ks, vs)


CASES = {  # cached lens, extend lens: decodes at page boundaries, chunks after a prefix, new prompts
    "decode": ([0, 1, 15, 16, 17, 63, 64, 65, 299, 1000], [1] * 10),
    "extend": ([0, 0, 5, 16, 31, 100, 0, 200, 7], [1, 40, 3, 17, 33, 1, 130, 70, 1]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 4), (128, 3), (24, 2)])  # 24: no fixed-size kernel
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (37, 0.0), (0, 30.0)])
def test_int8_cache_equals_the_kernel_over_the_dequantized_cache(ops, case, page_size, head_dim, group, window, softcap):
    """fp32: a decode token's rows scored in int8 (where the build does) as the reference computes them; every
    other row bit for bit the 16-bit path over rows q * scale; all within INT8_BOUND of the unquantized cache."""
    cached, extend = CASES[case]
    batch = random_batch(np.random.default_rng(page_size + head_dim + group), cached, extend, page_size)
    q, (k, v), int8 = random_caches(batch, 2 * group, 2, head_dim, page_size, seed=head_dim)
    kq, vq, ks, vs = int8
    dequantized = (dequantize_rows(kq, ks, torch.float32), dequantize_rows(vq, vs, torch.float32))
    got = attend(ops, q, int8, batch, page_size, window, softcap)
    want = attend(ops, q, dequantized, batch, page_size, window, softcap)
    if int8_decode_instruction(cpu_isa(), head_dim):
        decoded = int8_decode_reference(q, int8, batch, page_size, window, softcap)
        assert len(decoded) == 2 * group * int((batch.extend_lens == 1).sum()) > 0
        num_differing = 0  # from the fp32 walk's: the int8 walk ran (a one-key context is the value row in both)
        for (token, head), row in decoded.items():
            torch.testing.assert_close(got[token, head], row, **REFERENCE_TOLERANCE)
            num_differing += not torch.equal(got[token, head], want[token, head])
            want[token, head] = got[token, head]
        assert num_differing > len(decoded) // 2
    assert torch.equal(got, want)
    unquantized = attend(ops, q, (k, v), batch, page_size, window, softcap)
    assert (got - unquantized).abs().max().item() <= INT8_BOUND


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_bf16_queries_over_an_int8_cache(ops, case, page_size):
    """bf16 q and out over the int8 cache against fp32 attention over the dequantized cache (the bf16 path's own bound)."""
    cached, extend = CASES[case]
    batch = random_batch(np.random.default_rng(page_size), cached, extend, page_size)
    q, _, int8 = random_caches(batch, 8, 2, 64, page_size, seed=3)
    kq, vq, ks, vs = int8
    q16 = q.bfloat16()
    got = attend(ops, q16, int8, batch, page_size, window=50)
    assert got.dtype == torch.bfloat16
    dequantized = (dequantize_rows(kq, ks, torch.float32), dequantize_rows(vq, vs, torch.float32))
    want = attend(ops, q16.float(), dequantized, batch, page_size, window=50)
    if int8_decode_instruction(cpu_isa(), 64):  # a decode token's rows: the int8 walk's arithmetic, bf16 rounded
        for (token, head), row in int8_decode_reference(q16, int8, batch, page_size, window=50).items():
            want[token, head] = row
    torch.testing.assert_close(got.float(), want, **BF16_TOLERANCE)


@pytest.mark.parametrize("text,head_dim,instruction", [
    ("avx512+avx512_vnni", 64, "vpdpbusd zmm"), ("avx512+avx512_vnni+avx512_bf16+amx_int8", 128, "vpdpbusd zmm"),
    ("avx512", 64, ""), ("avx2", 128, "vpmaddubsw ymm"), ("avx2+avx_vnni", 64, "vpmaddubsw ymm"), ("baseline", 64, ""),
    ("avx512+avx512_vnni", 96, ""), ("avx2", 16, ""),
])
def test_int8_decode_instruction_of_each_set(text, head_dim, instruction):
    """Where the decode walk scores int8 queries (kernels/int8_attention.h's builds and head dims), by feature set."""
    assert int8_decode_instruction(IsaFeatures.parse(text), head_dim) == instruction


def test_int8_kernel_refuses_mismatched_scales(ops):
    batch = random_batch(np.random.default_rng(0), [10], [1], 4)
    q, _, (kq, vq, ks, vs) = random_caches(batch, 2, 1, 64, 4)
    with pytest.raises(RuntimeError, match="scales bf16"):
        attend(ops, q, (kq, vq, ks[:, :-1].contiguous(), vs), batch, 4)
    with pytest.raises(RuntimeError, match="scales bf16"):  # the fp32 scales of an older pool
        attend(ops, q, (kq, vq, ks.float(), vs.float()), batch, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)])
@pytest.mark.parametrize("rotary_dim", [64, 48])
def test_rope_store_int8_writes_what_rope_store_writes_quantized(ops, dtype, heads, rotary_dim):
    """Same rotated q as rope_store; its K and V rows quantized exactly as quantize_rows quantizes what rope_store
    stores (bit for bit: the same fp32 products); other slots untouched."""
    h, kvh = heads
    d, num_slots = 64, 40
    rotary = RotaryEmbedding(d, 10000.0, None, rotary_dim)
    for rows in (1, 5, 17):
        qkv = torch.randn(rows, h + 2 * kvh, d).to(dtype)
        qk, v = qkv[:, : h + kvh], qkv[:, h + kvh :]
        cos, sin = rotary(torch.randint(0, 4000, (rows,)), dtype)
        slots = torch.randperm(num_slots)[:rows]
        k16, v16 = torch.zeros(kvh, num_slots, d, dtype=dtype), torch.zeros(kvh, num_slots, d, dtype=dtype)
        q_ref = ops.rope_store(qk, v, cos, sin, k16, v16, slots, h)
        k8, v8 = torch.full((kvh, num_slots, d), 7, dtype=torch.int8), torch.full((kvh, num_slots, d), 7, dtype=torch.int8)
        ks, vs = (torch.full((kvh, num_slots), 9.0, dtype=SCALE_DTYPE) for _ in range(2))
        q = ops.rope_store_int8(qk, v, cos, sin, k8, v8, ks, vs, slots, h)
        assert torch.equal(q, q_ref)
        for cache, scales, ref in ((k8, ks, k16), (v8, vs, v16)):
            want_q, want_s = quantize_rows(ref[:, slots])
            assert torch.equal(cache[:, slots], want_q) and torch.equal(scales[:, slots], want_s)
            untouched = torch.ones(num_slots, dtype=torch.bool).index_fill_(0, slots, False)
            assert (cache[:, untouched] == 7).all() and (scales[:, untouched] == 9.0).all()
        if dtype == torch.bfloat16:
            torch.testing.assert_close(q, apply_rotary(qk, cos, sin)[:, :h], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_layer_on_an_int8_pool_kernel_and_torch_paths_agree(ops, page_size, dtype):
    """PagedAttention.forward over an int8 pool (K/V written by KVPool.write), the kernel backend against the torch
    one (which reads the pages dequantized): decodes, chunks after a cached prefix, new prompts. The torch path
    attends a new prompt over its own unquantized K/V, so the two differ by the int8 rounding (INT8_BOUND), and
    in bf16 by the bf16 path's own bound besides."""
    from zserve.model_proc.layers.attention import PagedAttention
    from zserve.model_proc.layers.attention_metadata import AttentionMetadata

    cached, extend = [12, 0, 33, 64, 0, 150], [1, 20, 1, 9, 1, 1]
    batch = random_batch(np.random.default_rng(11), cached, extend, page_size)
    num_pages = int(batch.page_ids.max()) + 1
    attn = PagedAttention(9, 3, 64, 0.125, layer_idx=0)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch.num_tokens, 9, 64, generator=gen).to(dtype)
    k, v = (torch.randn(batch.num_tokens, 3, 64, generator=gen).to(dtype) for _ in range(2))
    outs = []
    for backend in ("cpu_kernel", "torch"):
        pool = KVPool(1, 3, 64, page_size, num_pages, dtype, torch.device("cpu"), "int8")
        fill = torch.Generator().manual_seed(6)
        k_fill, v_fill = (torch.randn(pool.num_slots, 3, 64, generator=fill).to(dtype) for _ in range(2))
        pool.write(0, torch.arange(pool.num_slots), k_fill, v_fill)
        with torch.inference_mode():
            outs.append(attn(q, k, v, AttentionMetadata.build(batch, pool, dtype, backend=backend)).float())
    bound = INT8_BOUND + (0.05 if dtype == torch.bfloat16 else 0.0)
    assert (outs[0] - outs[1]).abs().max().item() <= bound


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_triton_path_over_a_quantized_pool_equals_the_cpu_kernel(ops, kv_cache_dtype):
    """The Triton backend (on the CPU under Triton's interpreter, which tests/conftest.py turns on) reads an int8 or
    fp8 layer converted (KVPool.dequantized): fp32, the same values the CPU kernel forms in place (this batch's
    decodes take head_dim 16, the fp32 walk, on every build)."""
    triton = pytest.importorskip("triton", reason="the triton package is not installed")
    if type(triton.language.standard.cdiv).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it)")
    from zserve.model_proc.layers.attention import PagedAttention
    from zserve.model_proc.layers.attention_metadata import AttentionMetadata

    cached, extend = [0, 13, 40, 5], [9, 1, 2, 1]
    batch = random_batch(np.random.default_rng(2), cached, extend, 16)
    attn = PagedAttention(4, 2, 16, 0.25, 0, sliding_window=20)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch.num_tokens, heads, 16, generator=gen) for heads in (4, 2, 2))
    outs = []
    for backend in ("triton", "cpu_kernel"):
        pool = KVPool(1, 2, 16, 16, int(batch.page_ids.max()) + 1, torch.float32, torch.device("cpu"), kv_cache_dtype)
        fill = torch.Generator().manual_seed(1)
        pool.write(0, torch.arange(pool.num_slots), *(torch.randn(pool.num_slots, 2, 16, generator=fill) for _ in range(2)))
        with torch.inference_mode():
            outs.append(attn(q, k, v, AttentionMetadata.build(batch, pool, torch.float32, backend=backend)))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_pool_writes_copies_and_reads_int8_rows():
    pool = KVPool(2, 2, 16, 4, 6, torch.bfloat16, torch.device("cpu"), "int8")
    assert pool.k[0].dtype == torch.int8 and pool.k_scales[1].shape == (2, 24) and pool.quantized
    k, v = torch.randn(3, 2, 16).bfloat16(), torch.randn(3, 2, 16).bfloat16()
    slots = torch.tensor([5, 0, 9])
    pool.write(1, slots, k, v)
    keys, values = pool.read_slots(1, slots)  # [kvh, 3, d] bf16, each within max|row| / 254 (+ bf16 rounding)
    for got, want in ((keys, k), (values, v)):
        assert got.dtype == torch.bfloat16
        bound = want.float().abs().amax(-1).transpose(0, 1)[..., None] / 254 + want.float().abs().transpose(0, 1) / 128
        assert ((got.float() - want.float().transpose(0, 1)).abs() <= bound).all()
    pool.copy_slots(torch.tensor([5, 9]), torch.tensor([20, 21]))
    assert torch.equal(pool.k[1][:, 20], pool.k[1][:, 5]) and torch.equal(pool.v_scales[1][:, 21], pool.v_scales[1][:, 9])
    key_pages, _ = pool.read_pages(1, torch.tensor([1, 5]))  # slots 4..7, 20..23
    assert torch.equal(key_pages[:, 1, 0], keys[:, 0]) and torch.equal(key_pages[:, 0, 1], keys[:, 0])
    assert pool.read_slots(0, slots)[0].abs().max() == 0  # layer 0 untouched
    assert pool.prefault() == pool.num_bytes  # a pool this small is touched whole


@pytest.mark.parametrize("head_dim,dtype,ratio", [(64, torch.bfloat16, 128 / 66), (128, torch.bfloat16, 256 / 130),
                                                  (64, torch.float32, 256 / 66)])
def test_int8_pool_holds_2d_over_d_plus_2_times_the_pages(monkeypatch, head_dim, dtype, ratio):
    """Sized by memory: d + 2 bytes a row (the int8 values and a bf16 scale) against the dtype's 2 d (4 d)."""
    from zserve.common.config_sections import CacheSection
    from zserve.model_proc import kv_pool_sizing
    from zserve.model_proc.layers import kv_pool

    monkeypatch.setattr(kv_pool, "free_memory_bytes", lambda device: 1 << 36)
    num_pages = {}
    for kv_cache_dtype in ("auto", "int8"):
        cache = CacheSection(page_size=16, kv_memory_fraction=0.01, kv_cache_dtype=kv_cache_dtype)
        sizing = kv_pool_sizing.KVPoolSizing(cache, 4, 2, head_dim, dtype, torch.device("cpu"))
        pool = sizing.after_weights(torch.nn.Linear(1, 1))
        assert pool.kv_cache_dtype == kv_cache_dtype
        num_pages[kv_cache_dtype] = pool.num_pages
        assert pool.num_bytes <= 0.01 * (1 << 36) < pool.num_bytes + pool.num_bytes // pool.num_pages
    assert num_pages["int8"] / num_pages["auto"] == pytest.approx(ratio, rel=2e-3)


@pytest.mark.skipif(os.environ.get("ZSERVE_CPU_ISA") is not None, reason="run once, by the process with every feature")
def test_int8_cache_at_every_lower_level():
    """This file again at avx512, avx2 and baseline where the CPU has them: widen_int8_row's AVX-512, AVX2 and
    scalar loops (a build each, about a minute or more)."""
    from tests.model.test_cpu_isa import rerun_at_old_levels

    rerun_at_old_levels(__file__, "not every_lower_level")
