"""The fp8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2, scale 1.0) on the CPU: the kernel that reads it in place
(zserve::paged_attention over fp8 caches), the fused rope/store that writes it (rope_store into fp8 caches),
KVPool's writes, copies and reads, and its page count; then this file again at every lower instruction set this
CPU runs (ZSERVE_CPU_ISA: a build each).

Tolerances: fp8 values widen to fp32 exactly, so against the 16-bit kernel over the same rows in fp32 (or in bf16,
which holds every fp8 value) the output is bit for bit the same, for fp32 and bf16 queries alike; except a decode
token's bf16 query rows where the build scores them from the keys' bytes with VDPBF16PS (fp8_decode_instruction;
kernels/fp8_attention.h): their sums round in another order, so those rows are held within BF16_SCORED (a bf16
rounding of the output) on random rows, and bit for bit where every product and sum is exact (integer-valued rows,
one-hot queries). Against the
unquantized cache the fp8 rounding moves each K/V value by up to 2^-4 (e4m3) or 2^-3 (e5m2) of itself: on these
random rows (|x| up to ~4, scores of q * 2) the output moves by at most FP8_BOUND.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.model.test_attention_kernel_int8 import CASES, index_of, random_batch
from zserve.model_proc.kernels import cpu_kernels
from zserve.model_proc.kernels.cpu_isa import cpu_isa, fp8_decode_instruction
from zserve.model_proc.layers.kv_fp8 import FP8_DTYPES, from_fp8, to_fp8
from zserve.model_proc.layers.kv_pool import KVPool
from zserve.model_proc.layers.rotary import RotaryEmbedding

FORMATS = sorted(FP8_DTYPES)
FP8_BOUND = {"fp8_e4m3": 0.5, "fp8_e5m2": 1.0}  # max |fp8-cache output - unquantized| (measured 0.35, 0.68; outputs ~1)
BF16_SCORED = {"rtol": 2**-7, "atol": 2**-9}  # VDPBF16PS-scored rows against the bf16 cache's (measured: 1 ulp, rarely)


@pytest.fixture(scope="module")
def ops():
    if not cpu_kernels.load_cpu_kernels():
        pytest.skip("the CPU kernels did not build on this machine")
    return torch.ops.zserve


def attend(ops, q, caches, batch, page_size, window=0, softcap=0.0, scale=0.125) -> torch.Tensor:
    """caches: (k, v), fp8 or of q's dtype (or fp32 under bf16 queries: see test_bf16_queries)."""
    out = torch.full_like(q, float("nan"))
    ops.paged_attention(q, *caches, out, *index_of(batch), page_size, scale, window, softcap)
    return out


def scored_from_bytes(q: torch.Tensor, head_dim: int, group: int) -> bool:
    """Whether this build scores a decode token's rows of `q` from the keys' bytes (VDPBF16PS), at most 64 rows a KV head."""
    return group <= 64 and bool(fp8_decode_instruction(cpu_isa(), head_dim, str(q.dtype).removeprefix("torch.")))


def assert_equals_the_16_bit_kernel(got, want, batch, scored: bool) -> None:
    """Bit for bit, but for decode tokens' rows when `scored` (scored_from_bytes): within BF16_SCORED there."""
    if not scored:
        assert torch.equal(got, want)
        return
    decode = torch.from_numpy(np.repeat(batch.extend_lens == 1, batch.extend_lens))
    assert torch.equal(got[~decode], want[~decode])
    torch.testing.assert_close(got[decode].float(), want[decode].float(), **BF16_SCORED)


def random_caches(batch, num_heads, num_kv_heads, head_dim, page_size, fmt, seed=0):
    """q, the unquantized fp32 caches, and those caches in fp8."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = (int(batch.page_ids.max()) + 1) * page_size
    k, v = (torch.randn(num_kv_heads, num_slots, head_dim, generator=gen) for _ in range(2))
    q = torch.randn(batch.num_tokens, num_heads, head_dim, generator=gen) * 2  # * 2: peakier softmax
    return q, (k, v), (to_fp8(k, FP8_DTYPES[fmt]), to_fp8(v, FP8_DTYPES[fmt]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 4), (128, 3), (24, 2)])  # 24: no fixed-size kernel
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (37, 0.0), (0, 30.0)])
def test_fp8_cache_equals_the_kernel_over_the_rows_in_fp32(ops, fmt, case, page_size, head_dim, group, window, softcap):
    """fp32: bit for bit the 16-bit path over the fp8 rows widened to fp32; and within FP8_BOUND of the unquantized
    cache."""
    cached, extend = CASES[case]
    batch = random_batch(np.random.default_rng(page_size + head_dim + group), cached, extend, page_size)
    q, (k, v), fp8 = random_caches(batch, 2 * group, 2, head_dim, page_size, fmt, seed=head_dim)
    got = attend(ops, q, fp8, batch, page_size, window, softcap)
    widened = tuple(from_fp8(x, torch.float32) for x in fp8)
    assert torch.equal(got, attend(ops, q, widened, batch, page_size, window, softcap))
    unquantized = attend(ops, q, (k, v), batch, page_size, window, softcap)
    assert (got - unquantized).abs().max().item() <= FP8_BOUND[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_bf16_queries_over_an_fp8_cache_equal_the_bf16_cache_of_its_values(ops, fmt, case, page_size):
    """bf16 holds every fp8 value, so a bf16 cache of the same values is the same fp32 rows: bit for bit (decode rows
    scored from the bytes: within BF16_SCORED)."""
    cached, extend = CASES[case]
    batch = random_batch(np.random.default_rng(page_size), cached, extend, page_size)
    q, _, fp8 = random_caches(batch, 8, 2, 64, page_size, fmt, seed=3)
    q16 = q.bfloat16()
    got = attend(ops, q16, fp8, batch, page_size, window=50)
    assert got.dtype == torch.bfloat16
    want = attend(ops, q16, tuple(from_fp8(x, torch.bfloat16) for x in fp8), batch, page_size, window=50)
    assert_equals_the_16_bit_kernel(got, want, batch, scored_from_bytes(q16, 64, 4))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,group", [(64, 2), (64, 5), (64, 6), (64, 7), (128, 1), (128, 4), (128, 5), (64, 72)])
def test_decode_walk_groups_equal_the_kernel_over_the_rows_in_fp32(ops, fmt, dtype, head_dim, group):
    """A decode token's query heads per KV head in every remainder of the AVX-512 walk's passes (4 rows a pass at head
    dim 64, 3 at 128) and past its 64 (72: attend()'s walk), long enough for many tiles and prefetched pages: bit for
    bit the 16-bit path over the rows widened (fp32 rows under fp32 queries, bf16 rows, which hold every fp8 value,
    under bf16 ones; within BF16_SCORED where the build scores bf16 rows from the bytes)."""
    page_size = 16
    batch = random_batch(np.random.default_rng(group), [0, 63, 64, 700, 2100], [1] * 5, page_size)
    q, _, fp8 = random_caches(batch, 2 * group, 2, head_dim, page_size, fmt, seed=group)
    q = q.to(dtype)
    for window in (0, 300):
        got = attend(ops, q, fp8, batch, page_size, window)
        want = attend(ops, q, tuple(from_fp8(x, dtype) for x in fp8), batch, page_size, window)
        assert_equals_the_16_bit_kernel(got, want, batch, scored_from_bytes(q, head_dim, group))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim,group", [(64, 3), (64, 6), (128, 4), (128, 5)])
def test_bf16_decode_rows_with_exact_sums_equal_the_bf16_cache_bit_for_bit(ops, fmt, head_dim, group):
    """Integer-valued queries (-3..3) and keys (-8..8, exact in both formats) with a power-of-two scale: every product
    and partial sum is an exact integer, so any order gives the same scores and the VDPBF16PS-scored rows (where the
    build has them) equal the bf16 cache's bit for bit: the keys' lanes, pairs and tails (tiles of 64, blocks of 16,
    a partial last block) are where attend() has them."""
    page_size = 16
    batch = random_batch(np.random.default_rng(head_dim + group), [0, 5, 63, 64, 200, 1000], [1] * 6, page_size)
    gen = torch.Generator().manual_seed(group)
    num_slots = (int(batch.page_ids.max()) + 1) * page_size
    k = torch.randint(-8, 9, (2, num_slots, head_dim), generator=gen).float()
    v = torch.randn(2, num_slots, head_dim, generator=gen)
    q = torch.randint(-3, 4, (batch.num_tokens, 2 * group, head_dim), generator=gen).bfloat16()
    fp8 = (to_fp8(k, FP8_DTYPES[fmt]), to_fp8(v, FP8_DTYPES[fmt]))
    assert torch.equal(fp8[0].float(), k)
    for window, softcap in ((0, 0.0), (70, 0.0), (0, 30.0)):
        got = attend(ops, q, fp8, batch, page_size, window, softcap, scale=2**-6)
        want = attend(ops, q, tuple(from_fp8(x, torch.bfloat16) for x in fp8), batch, page_size, window, softcap,
                      scale=2**-6)
        assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_finite_byte_as_a_key_scores_its_value(ops, fmt, head_dim):
    """Keys holding every finite byte of the format (subnormals, both zeros, the largest), each beside a zero key,
    and bf16 one-hot queries (head h reads dim h): the score is that byte's value times the scale, exactly, and the
    output (values 1 for the byte's key, 0 for the zero key) its sigmoid. One call per power-of-two scale from 2^-20 to
    2^20 puts every byte's value times the scale near 1 in some call, where a wrong conversion would move the output;
    each call bit for bit the bf16 cache's (VDPBF16PS-scored where the build does)."""
    values = finite_bytes(fmt)
    num_rows = -(-values.numel() // head_dim)
    rows = torch.cat([values, values[: num_rows * head_dim - values.numel()]]).view(num_rows, head_dim)
    k = torch.zeros(2 * num_rows, head_dim, dtype=values.dtype)  # request r: its row's keys at slots 2r, 2r + 1
    k[0::2] = rows
    v = torch.zeros(2 * num_rows, head_dim, dtype=values.dtype)
    v[0::2] = torch.ones(num_rows, head_dim).to(values.dtype)
    k, v = k[None].contiguous(), v[None].contiguous()
    index = (torch.arange(num_rows), torch.ones(num_rows, dtype=torch.long), torch.ones(num_rows, dtype=torch.long),
             2 * torch.arange(num_rows), torch.arange(2 * num_rows))
    widened = (from_fp8(k, torch.bfloat16), from_fp8(v, torch.bfloat16))
    for first in range(0, head_dim, 64):  # 64 query heads a call: the most the decode walk takes
        q = torch.eye(head_dim, dtype=torch.bfloat16)[first : first + 64][None].expand(num_rows, 64, head_dim).contiguous()
        assert scored_from_bytes(q, head_dim, 64) == bool(fp8_decode_instruction(cpu_isa(), head_dim, "bfloat16"))
        for exponent in range(-20, 21):
            got, want = torch.empty_like(q), torch.empty_like(q)
            ops.paged_attention(q, k, v, got, *index, 1, 2.0**exponent, 0, 0.0)
            ops.paged_attention(q, *widened, want, *index, 1, 2.0**exponent, 0, 0.0)
            assert torch.equal(got, want), (first, exponent)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_finite_byte_through_the_decode_walk(ops, fmt, head_dim):
    """Requests decoding their first token (one key each) whose value rows hold every finite byte of the format: each
    output row is its value row widened, whatever the query (the decode walk's in-register widening, subnormals and both
    zeros included); their keys the same bytes, reversed, so every byte also enters a dot product."""
    values = finite_bytes(fmt)
    num = -(-values.numel() // head_dim)
    rows = torch.cat([values, values[: num * head_dim - values.numel()]]).view(1, num, head_dim).contiguous()
    keys = rows.view(torch.uint8).flip(-1).contiguous().view(rows.dtype)
    ones, arange = torch.ones(num, dtype=torch.long), torch.arange(num)
    q = torch.randn(num, 3, head_dim)
    out = torch.empty_like(q)
    ops.paged_attention(q, keys, rows, out, arange, ones, torch.zeros(num, dtype=torch.long), arange, arange, 1, 0.125,
                        0, 0.0)
    want = rows[0].float()[:, None, :].expand(num, 3, head_dim)
    assert torch.equal(out, want)


@pytest.mark.parametrize("text,head_dim,dtype,instruction", [
    ("avx512+avx512_vnni+avx512_bf16", 64, "bfloat16", "vdpbf16ps zmm"),
    ("avx512+avx512_vnni+avx_vnni+avx512_bf16+amx_int8", 128, "bfloat16", "vdpbf16ps zmm"),
    ("avx512+avx512_vnni+avx512_bf16", 64, "float32", ""), ("avx512+avx512_vnni+avx512_bf16", 96, "bfloat16", ""),
    ("avx512+avx512_vnni", 64, "bfloat16", ""), ("avx512", 64, "bfloat16", ""), ("avx2+avx_vnni", 64, "bfloat16", ""),
    ("baseline", 128, "bfloat16", ""),
])
def test_fp8_decode_instruction_of_each_set(text, head_dim, dtype, instruction):
    from zserve.model_proc.kernels.cpu_isa import IsaFeatures

    assert fp8_decode_instruction(IsaFeatures.parse(text), head_dim, dtype) == instruction


def finite_bytes(fmt: str) -> torch.Tensor:
    """Every byte pattern of the format that is a finite number (254 for e4m3, 248 for e5m2), as that format."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPES[fmt])
    return values[values.float().isfinite()]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_finite_byte_widens_to_its_value(ops, fmt, dtype):
    """One key and value row holding every finite byte (d = 254 or 248: the 16-wide, 8-wide and scalar loops all run
    at AVX-512; keys and values go through the same load_row), one query: the output is the value row, widened.
    Subnormals, both zeros, the largest."""
    values = finite_bytes(fmt)
    row = values.view(1, 1, -1).contiguous()
    d = row.shape[-1]
    q, out = torch.zeros(1, 1, d, dtype=dtype), torch.empty(1, 1, d, dtype=dtype)
    zero, one = torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    ops.paged_attention(q, row, row, out, zero, one, zero, zero, zero, 1, 1.0, 0, 0.0)
    assert torch.equal(out[0, 0], values.to(dtype))  # bf16 holds every fp8 value, so no rounding there either


def test_kernel_refuses_mixed_fp8_formats(ops):
    batch = random_batch(np.random.default_rng(0), [10], [1], 4)
    q, _, (k, v) = random_caches(batch, 2, 1, 64, 4, "fp8_e4m3")
    with pytest.raises(RuntimeError, match="fp8 caches of one format"):
        attend(ops, q, (k, v.view(torch.uint8).view(torch.float8_e5m2)), batch, 4)


def special_values(fmt: str) -> torch.Tensor:
    """fp32 values where the conversion is delicate: past the range (to +-max, not NaN or inf), the infinities,
    negative zero, the subnormals and below them, every midpoint between neighbouring finite values (a tie: to the
    even one) and a hair either side of it."""
    finite = finite_bytes(fmt).float().unique()  # sorted, -max .. max, one zero
    mids = (finite[1:] + finite[:-1]) / 2  # exact in fp32
    hair = mids.abs() * 2**-20 + 2**-40
    biggest = finite.max().item()
    edges = [biggest * 1.01, biggest * 1.07, 1e6, 3e38, float("inf"), -0.0, 0.0, 2**-7, 2**-10, 2**-17, 2**-20, 1e-30]
    edges = torch.tensor(edges + [-x for x in edges])
    return torch.cat([finite, mids, mids + hair, mids - hair, edges])


@pytest.mark.parametrize("fmt", FORMATS)
def test_to_fp8_clamps_rounds_to_nearest_even_and_keeps_negative_zero(fmt):
    fp8_dtype = FP8_DTYPES[fmt]
    biggest = torch.finfo(fp8_dtype).max
    got = to_fp8(torch.tensor([biggest * 2, -float("inf"), -0.0, 1.0]), fp8_dtype)
    assert got.float().tolist() == [biggest, -biggest, 0.0, 1.0]
    assert got.view(torch.uint8)[2].item() == 0x80  # -0.0 keeps its sign
    finite = finite_bytes(fmt).float().unique()
    below, above = finite[100], finite[101]
    tie = to_fp8(((below + above) / 2)[None], fp8_dtype).float().item()
    assert tie in (below.item(), above.item())
    even = below if (to_fp8(below[None], fp8_dtype).view(torch.uint8).item() & 1) == 0 else above
    assert tie == even.item()


def rope_inputs(rows, h, kvh, d, dtype, special=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, h + 2 * kvh, d, generator=gen) * 150  # * 150: some past e4m3's 448
    if special is not None:  # drawn from `special` (v, and k's pass-through dims, keep them as they are)
        qkv = special[torch.randint(0, special.numel(), qkv.shape, generator=gen)]
    qkv = qkv.to(dtype)
    return qkv[:, : h + kvh], qkv[:, h + kvh :]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)])
@pytest.mark.parametrize("rotary_dim", [64, 48])
@pytest.mark.parametrize("special", [False, True])
def test_rope_store_into_fp8_writes_the_bytes_kvpool_write_stores(ops, fmt, dtype, heads, rotary_dim, special):
    """rope_store into fp8 caches: the same rotated q as into 16-bit ones, and K and V bytes equal to what
    KVPool.write stores for what rope_store stores (past the range, infinities, negative zero, subnormals, ties:
    `special`); other slots untouched."""
    h, kvh = heads
    d, num_slots = 64, 40
    fp8_dtype = FP8_DTYPES[fmt]
    rotary = RotaryEmbedding(d, 10000.0, None, rotary_dim)
    for rows in (1, 5, 17):
        qk, v = rope_inputs(rows, h, kvh, d, dtype, special_values(fmt) if special else None, seed=rows)
        cos, sin = rotary(torch.randint(0, 4000, (rows,)), dtype)
        slots = torch.randperm(num_slots)[:rows]
        k16, v16 = torch.zeros(kvh, num_slots, d, dtype=dtype), torch.zeros(kvh, num_slots, d, dtype=dtype)
        q_ref = ops.rope_store(qk, v, cos, sin, k16, v16, slots, h)
        k8, v8 = (torch.full((kvh, num_slots, d), 7.0).to(fp8_dtype) for _ in range(2))
        q = ops.rope_store(qk, v, cos, sin, k8, v8, slots, h)
        torch.testing.assert_close(q, q_ref, rtol=0, atol=0, equal_nan=True)  # special: inf - inf in a rotation
        pool = KVPool(1, kvh, d, 1, num_slots, dtype, torch.device("cpu"), fmt)
        pool.write(0, slots, k16[:, slots].transpose(0, 1), v16[:, slots].transpose(0, 1))
        for cache, written in ((k8, pool.k[0]), (v8, pool.v[0])):
            got, want = cache[:, slots].view(torch.uint8), written[:, slots].view(torch.uint8)
            assert torch.equal(got, want), (got != want).sum()  # NaN too (a K row rotated from inf: inf - inf)
            untouched = torch.ones(num_slots, dtype=torch.bool).index_fill_(0, slots, False)
            assert (cache[:, untouched].float() == 7.0).all()
        if special:  # v is stored as given: the writers agree with to_fp8 of the input, not only with each other
            assert torch.equal(v8[:, slots].view(torch.uint8), to_fp8(v.transpose(0, 1), fp8_dtype).view(torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rope_store_into_fp8_over_every_bf16_value(ops, fmt):
    """Every bf16 bit pattern but the NaNs as V rows (which rope_store converts as given): the C++ conversion's bytes
    equal torch's (to_fp8) for all 65280 of them."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = bits[~bits.isnan()]
    kvh, d = 8, 64
    rows = -(-values.numel() // (kvh * d))
    v = torch.cat([values, values[: rows * kvh * d - values.numel()]]).view(rows, kvh, d)
    qk = torch.zeros(rows, 1 + kvh, d, dtype=torch.bfloat16)
    cos, sin = torch.ones(rows, d, dtype=torch.bfloat16), torch.zeros(rows, d, dtype=torch.bfloat16)
    k8, v8 = (torch.zeros(kvh, rows, d).to(FP8_DTYPES[fmt]) for _ in range(2))
    ops.rope_store(qk, v, cos, sin, k8, v8, torch.arange(rows), 1)
    want = to_fp8(v.transpose(0, 1), FP8_DTYPES[fmt]).view(torch.uint8)
    assert torch.equal(v8.view(torch.uint8), want), (v8.view(torch.uint8) != want).sum()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_and_unfused_rotary_on_an_fp8_pool_give_the_same_output(ops, fmt, dtype):
    """PagedAttention.forward_rotary with the fused rope/store (rope_store into the fp8 pool) and without it (torch's
    rotary, KVPool.write), both on the kernel backend: in bf16 (every product rounded in both) the same bytes stored
    and the same outputs; in fp32 the C++ rotation may fuse a product and a sum (an ulp), so close."""
    from zserve.model_proc.layers.attention import PagedAttention
    from zserve.model_proc.layers.attention_metadata import AttentionMetadata

    cached, extend = [12, 0, 33, 0], [1, 20, 1, 1]
    batch = random_batch(np.random.default_rng(4), cached, extend, 16)
    rotary = RotaryEmbedding(64, 10000.0, None, 64)
    qk, v = rope_inputs(batch.num_tokens, 9, 3, 64, dtype, seed=8)
    positions = np.concatenate([np.arange(c, c + e) for c, e in zip(cached, extend, strict=True)])
    cos, sin = rotary(torch.from_numpy(positions), dtype)
    outs, pools = [], []
    for fused in (True, False):
        attn = PagedAttention(9, 3, 64, 0.125, layer_idx=0)
        if fused:
            attn.use_cpu_kernels()
        pool = KVPool(1, 3, 64, 16, int(batch.page_ids.max()) + 1, dtype, torch.device("cpu"), fmt)
        fill = torch.Generator().manual_seed(6)
        pool.write(0, torch.arange(pool.num_slots), *(torch.randn(pool.num_slots, 3, 64, generator=fill).to(dtype) * 9
                                                      for _ in range(2)))
        with torch.inference_mode():
            meta = AttentionMetadata.build(batch, pool, dtype, backend="cpu_kernel")
            outs.append(attn.forward_rotary(qk, v, cos, sin, meta))
        pools.append(pool)
    assert torch.equal(pools[0].v[0].view(torch.uint8), pools[1].v[0].view(torch.uint8))
    if dtype == torch.bfloat16:
        assert torch.equal(pools[0].k[0].view(torch.uint8), pools[1].k[0].view(torch.uint8))
        assert torch.equal(outs[0], outs[1])
    else:
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_layer_on_an_fp8_pool_kernel_and_torch_paths_agree(ops, fmt, page_size, dtype):
    """PagedAttention.forward over an fp8 pool, the kernel backend against the torch one (which reads the pages
    converted): decodes, chunks after a cached prefix, new prompts. The torch path attends a new prompt over its
    own unquantized K/V, so the two differ by the fp8 rounding there, and in bf16 by the bf16 path's own bound."""
    from zserve.model_proc.layers.attention import PagedAttention
    from zserve.model_proc.layers.attention_metadata import AttentionMetadata

    cached, extend = [12, 0, 33, 64, 0, 150], [1, 20, 1, 9, 1, 1]
    batch = random_batch(np.random.default_rng(11), cached, extend, page_size)
    attn = PagedAttention(9, 3, 64, 0.125, layer_idx=0)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch.num_tokens, 9, 64, generator=gen).to(dtype)
    k, v = (torch.randn(batch.num_tokens, 3, 64, generator=gen).to(dtype) for _ in range(2))
    outs = []
    for backend in ("cpu_kernel", "torch"):
        pool = KVPool(1, 3, 64, page_size, int(batch.page_ids.max()) + 1, dtype, torch.device("cpu"), fmt)
        fill = torch.Generator().manual_seed(6)
        pool.write(0, torch.arange(pool.num_slots), *(torch.randn(pool.num_slots, 3, 64, generator=fill).to(dtype)
                                                      for _ in range(2)))
        with torch.inference_mode():
            outs.append(attn(q, k, v, AttentionMetadata.build(batch, pool, dtype, backend=backend)).float())
    bound = FP8_BOUND[fmt] + (0.05 if dtype == torch.bfloat16 else 0.0)
    assert (outs[0] - outs[1]).abs().max().item() <= bound


@pytest.mark.parametrize("fmt", FORMATS)
def test_pool_writes_copies_and_reads_fp8_rows(fmt):
    pool = KVPool(2, 2, 16, 4, 6, torch.bfloat16, torch.device("cpu"), fmt)
    assert pool.k[0].dtype == FP8_DTYPES[fmt] and pool.fp8 and not pool.quantized and pool.k_scales == []
    k, v = torch.randn(3, 2, 16).bfloat16() * 100, torch.randn(3, 2, 16).bfloat16()
    slots = torch.tensor([5, 0, 9])
    pool.write(1, slots, k, v)
    keys, values = pool.read_slots(1, slots)  # [kvh, 3, d] bf16: the fp8 values, exactly
    for got, want in ((keys, k), (values, v)):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, to_fp8(want.transpose(0, 1), FP8_DTYPES[fmt]).bfloat16())
    pool.copy_slots(torch.tensor([5, 9]), torch.tensor([20, 21]))
    assert torch.equal(pool.k[1][:, 20].view(torch.uint8), pool.k[1][:, 5].view(torch.uint8))
    assert torch.equal(pool.v[1][:, 21].view(torch.uint8), pool.v[1][:, 9].view(torch.uint8))
    key_pages, _ = pool.read_pages(1, torch.tensor([1, 5]))  # slots 4..7, 20..23
    assert torch.equal(key_pages[:, 1, 0], keys[:, 0]) and torch.equal(key_pages[:, 0, 1], keys[:, 0])
    assert torch.equal(pool.dequantized(1)[0][:, 5], keys[:, 0])
    assert pool.read_slots(0, slots)[0].abs().max() == 0  # layer 0 untouched
    assert pool.num_bytes == 2 * 2 * 2 * 24 * 16  # K and V, layers, heads, slots, d bytes
    assert pool.prefault() == pool.num_bytes  # a pool this small is touched whole


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype,ratio", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_fp8_pool_holds_exactly_twice_the_pages_of_a_16_bit_one(monkeypatch, fmt, dtype, ratio):
    """Sized by memory: d bytes a row against the dtype's 2 d (4 d). A budget that is a whole number of 16-bit
    pages gives exactly `ratio` times the pages; any budget gives ratio * n .. ratio * n + ratio - 1 (the floor)."""
    from zserve.common.config_sections import CacheSection
    from zserve.model_proc import kv_pool_sizing
    from zserve.model_proc.layers import kv_pool

    assert KVPool.bytes_per_token(4, 2, 64, dtype, fmt) * ratio == KVPool.bytes_per_token(4, 2, 64, dtype, "auto")
    for free_bytes, fraction, exact in ((1 << 36, 2**-7, True), ((1 << 36) + 12345, 0.013, False)):
        monkeypatch.setattr(kv_pool, "free_memory_bytes", lambda device, free_bytes=free_bytes: free_bytes)
        num_pages = {}
        for kv_cache_dtype in ("auto", fmt):
            cache = CacheSection(page_size=16, kv_memory_fraction=fraction, kv_cache_dtype=kv_cache_dtype)
            pool = kv_pool_sizing.KVPoolSizing(cache, 4, 2, 64, dtype, torch.device("cpu")).after_weights(
                torch.nn.Linear(1, 1)
            )
            assert pool.kv_cache_dtype == kv_cache_dtype
            num_pages[kv_cache_dtype] = pool.num_pages
            assert pool.num_bytes <= fraction * free_bytes < pool.num_bytes + pool.num_bytes // pool.num_pages
        if exact:
            assert num_pages[fmt] == ratio * num_pages["auto"], num_pages
        assert ratio * num_pages["auto"] <= num_pages[fmt] < ratio * (num_pages["auto"] + 1), num_pages


def test_pool_refuses_an_unknown_cache_dtype():
    with pytest.raises(ValueError, match="--kv-cache-dtype 'q4_0': expected one of auto, int8, fp8_e4m3, fp8_e5m2"):
        KVPool(1, 1, 16, 4, 2, torch.float32, torch.device("cpu"), "q4_0")


@pytest.mark.skipif(os.environ.get("ZSERVE_CPU_ISA") is not None, reason="run once, by the process with every feature")
@pytest.mark.timeout(3600)  # up to three kernel builds in children: past the suite's 600 s when loaded
def test_fp8_cache_at_every_lower_level():
    """This file again at avx512, avx2 and baseline where the CPU has them: widen_fp8_row's AVX-512, AVX2 + F16C and
    scalar loops (a build each, about a minute or more)."""
    from tests.model.test_cpu_isa import rerun_at_old_levels

    rerun_at_old_levels(__file__, "not every_lower_level")
