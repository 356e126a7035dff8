"""The fused elementwise ops (model_proc/kernels/fused_ops.cpp) against the torch ops they replace.

They round where those ops round, so bf16 results match them exactly except where an fp32
intermediate differs in its last bit (a sum taken in another order, our exp against torch's):
there an output may move by an ulp or two, in a small fraction of elements (bounded below).
fp32 results stay within a few ulps.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zserve.model_proc.kernels.cpu_kernels import load_cpu_kernels
from zserve.model_proc.layers.activation import silu_and_mul
from zserve.model_proc.layers.rotary import RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.skipif(not load_cpu_kernels(), reason="the CPU kernels did not build on this machine")
DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 3, 64, 300]  # 300 x wide rows crosses the threading grain


def assert_near(ours: torch.Tensor, ref: torch.Tensor, max_fraction_moved: float):
    """bf16: equal except a small fraction of elements, at most two ulps apart (relative 2^-6:
    an intermediate rounded one ulp apart, times the weight, rounds again). fp32: within 4
    ulps everywhere (an rms that differs in its last bit moves most outputs by one; our exp is
    within about 2 ulps of torch's)."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    moved = ours != ref
    if ref.dtype == torch.float32:
        max_fraction_moved = 1.0
    rel = {torch.bfloat16: 2.0**-6, torch.float32: 2.0**-21}[ref.dtype]
    diff = (ours.float() - ref.float()).abs()
    larger = torch.maximum(ours.float().abs(), ref.float().abs())  # one ulp of the larger: a rounding may cross a power of two
    assert (diff <= rel * larger * 1.01 + 1e-30).all(), float(diff.max())
    assert moved.float().mean() <= max_fraction_moved, float(moved.float().mean())


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    for rows in ROWS:
        x = (torch.randn(rows, 576) * 3).to(dtype)
        w = torch.randn(576).to(dtype)
        ref = F.rms_norm(x, (576,), None, 1e-5) * w
        assert_near(torch.ops.zserve.rms_norm(x, w, 1e-5), ref, 0.01)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_in_place(dtype):
    for rows in ROWS:
        x, delta = (torch.randn(rows, 576) * 2).to(dtype), torch.randn(rows, 576).to(dtype)
        w = torch.randn(576).to(dtype)
        residual = x.clone()
        y = torch.ops.zserve.add_rms_norm_(delta, residual, w, 1e-6)
        assert torch.equal(residual, x + delta)  # one rounding of the sum, as torch's add
        assert_near(y, F.rms_norm(x + delta, (576,), None, 1e-6) * w, 0.01)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    for rows in ROWS:
        gate_up = (torch.randn(rows, 2 * 1536) * 4).to(dtype)
        assert_near(torch.ops.zserve.silu_mul(gate_up), silu_and_mul(gate_up), 0.01)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("rotary_dim", [64, 48])  # 48: a partial rotary, the last 16 dims passed through
def test_rope_store(dtype, heads, rotary_dim):
    """Rotated q returned; rotated k and v written at their slots; other slots untouched."""
    h, kvh = heads
    d, num_slots = 64, 40
    rotary = RotaryEmbedding(d, 10000.0, None, rotary_dim)
    for rows in (1, 5, 17):
        qkv = torch.randn(rows, h + 2 * kvh, d).to(dtype)
        qk, v = qkv[:, : h + kvh], qkv[:, h + kvh :]  # views with qkv's strides, as the model passes them
        positions = torch.randint(0, 4000, (rows,))
        cos, sin = rotary(positions, dtype)
        slots = torch.randperm(num_slots)[:rows]
        k_cache, v_cache = torch.randn(kvh, num_slots, d).to(dtype), torch.randn(kvh, num_slots, d).to(dtype)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        rotated = apply_rotary(qk, cos, sin)
        k_ref.index_copy_(1, slots, rotated[:, h:].transpose(0, 1))
        v_ref.index_copy_(1, slots, v.transpose(0, 1))
        q = torch.ops.zserve.rope_store(qk, v, cos, sin, k_cache, v_cache, slots, h)
        assert torch.equal(v_cache, v_ref)
        if dtype == torch.bfloat16:  # each product rounded before the sum, as apply_rotary: bit for bit
            assert torch.equal(q, rotated[:, :h]) and torch.equal(k_cache, k_ref)
        else:  # fp32: the compiler may fuse a product into the sum (one rounding, not two): an
            # ulp of the products (|x| < ~5 here), which is more than an ulp of a sum that cancels
            torch.testing.assert_close(q, rotated[:, :h], rtol=0, atol=4e-6)
            torch.testing.assert_close(k_cache, k_ref, rtol=0, atol=4e-6)


def test_rope_store_rejects_a_slot_outside_the_cache():
    k_cache = torch.zeros(1, 8, 4)
    qk, v, cs = torch.zeros(1, 2, 4), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.zserve.rope_store(qk, v, cs, cs, k_cache, k_cache.clone(), torch.tensor([8]), 1)
