"""A GGUF file's quantized matrices kept as stored (--quantization gguf): the block decoder
(model_proc/gguf_blocks.py) against gguf's own dequantization, bit for bit, for every type it
keeps (Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 quantized by gguf; Q4_K, Q5_K and Q6_K as random blocks with valid
scales, which gguf cannot quantize to); the 4-bit kernel zserve::gemm_int4_dot and the int8 one
with offsets and groups of 16 against the exact product of the quantized activations and the
dequantized weights; and the pieces of a fused weight in two formats joined exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.gguf_fixtures import quantized_tensor
from tests.model.test_gemm_int8_dot import assert_close_to_exact, needs_kernel, random_rows
from zserve.model_proc.gguf_blocks import STORED_TYPES, decode
from zserve.model_proc.layers.int4_weights import Int4Weight, common_format
from zserve.model_proc.layers.int8_activations import fake_quantize
from zserve.model_proc.layers.int8_weights import Int8Weight
from zserve.model_proc.layers.weight_kernels.column_blocks import pack_column_blocks, pack_int4_nibbles, pack_int8_quads
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8TorchKernel, ZserveInt8DotKernel
from zserve.model_proc.layers.weight_kernels.quantized_weight import join_columns

ROWS, COLS = 40, 512  # two K-quant super-blocks per row


def as_weight(type_name: str, raw: np.ndarray, rows: int, cols: int) -> Int8Weight | Int4Weight:
    """The decoded [rows, cols] matrix as the [in, out] weight the reader hands the layers."""
    b = decode(type_name, raw, rows, cols)
    offsets = None if b.offsets is None else b.offsets.t().contiguous()
    if b.bits == 4:
        return Int4Weight(b.codes.t().contiguous(), b.scales.t().contiguous(), offsets, b.group_size)
    return Int8Weight(b.codes.t().contiguous(), b.scales.t().contiguous(), b.group_size, offsets)


def stored(type_name: str, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> tuple[np.ndarray, Int8Weight | Int4Weight]:
    data = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    raw, _ = quantized_tensor(type_name, data, seed=seed)
    return raw, as_weight(type_name, raw, rows, cols)


@pytest.mark.parametrize("type_name", STORED_TYPES)
def test_decoded_blocks_equal_gguf_dequantization_bit_for_bit(type_name):
    import gguf

    raw, weight = stored(type_name)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(ROWS, COLS)
    ours = weight.dequantize().t().numpy()
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs), float(np.abs(ours - theirs).max())
    expected_format = Int4Weight if type_name in ("Q4_0", "Q4_1", "Q4_K") else Int8Weight
    assert type(weight) is expected_format
    assert weight.group_size == (16 if type_name == "Q6_K" else 32)
    if isinstance(weight, Int4Weight):
        assert int(weight.codes.max()) <= 15 and weight.codes.dtype == torch.uint8


def test_decoding_rejects_other_types():
    with pytest.raises(ValueError, match="GGUF type Q2_K is not kept as stored"):
        decode("Q2_K", np.zeros(84, np.uint8), 1, 256)


def test_nibble_layout():
    codes = (torch.arange(16 * 13) % 16).to(torch.uint8).view(16, 13)  # K 16, N 13
    packed = pack_int4_nibbles(codes)
    assert packed.shape == (1, 2, 16, 4) and packed.dtype == torch.uint8
    p, j, i = 1, 5, 2
    assert int(packed[0, p, j, i]) == int(codes[8 * p + i, j]) | int(codes[8 * p + 4 + i, j]) << 4
    assert torch.equal(packed[0, :, 13:], torch.zeros(2, 3, 4, dtype=torch.uint8))


@needs_kernel
@pytest.mark.parametrize("type_name", STORED_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernels_equal_quantized_activations_times_dequantized_weights(type_name, dtype):
    _, weight = stored(type_name, rows=37, cols=256, seed=1)  # 37 outputs: off the blocks of 16
    deq = weight.dequantize().double()
    four_bit = isinstance(weight, Int4Weight)
    values = pack_int4_nibbles(weight.codes) if four_bit else pack_int8_quads(weight.q)
    offsets = None if weight.offsets is None else pack_column_blocks(weight.offsets)
    gemm = torch.ops.zserve.gemm_int4_dot if four_bit else torch.ops.zserve.gemm_int8_dot
    for rows in (1, 2, 5, 9, 17):
        x = random_rows(rows, 256, seed=rows).to(dtype)
        y = gemm(x, values, pack_column_blocks(weight.scales), offsets, 37, None, weight.group_size)
        xq = fake_quantize(x).double()
        assert_close_to_exact(y, xq @ deq, xq.abs() @ deq.abs(), (type_name, rows))


@needs_kernel
def test_int4_kernel_rejects_bad_inputs():
    _, weight = stored("Q4_1", rows=16, cols=64)
    values, scales = pack_int4_nibbles(weight.codes), pack_column_blocks(weight.scales)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match=r"the codes must be contiguous uint8 \[NB, K / 8 = 8, 16, 4\]"):
        torch.ops.zserve.gemm_int4_dot(x, pack_int8_quads(weight.codes.to(torch.int8)), scales, None, 16, None, 32)
    with pytest.raises(RuntimeError, match="offsets must be contiguous float32 shaped like the scales"):
        torch.ops.zserve.gemm_int4_dot(x, values, scales, scales[:, :1].contiguous(), 16, None, 32)


def test_a_fused_weight_of_4_bit_and_int8_pieces_joins_exactly():
    """Q4_K_M's attention: q and k in Q4_K (4-bit, groups of 32), v in Q6_K (int8, groups of 16)."""
    _, q = stored("Q4_K", rows=16, cols=256, seed=2)
    _, k = stored("Q4_K", rows=16, cols=256, seed=3)
    _, v = stored("Q6_K", rows=32, cols=256, seed=4)
    joined = join_columns([(0, q), (16, k), (32, v)], 64)
    assert isinstance(joined, Int8Weight) and joined.group_size == 16 and joined.offsets is not None
    assert torch.equal(joined.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()], dim=1))
    assert isinstance(join_columns([(0, q), (16, k)], 32), Int4Weight)  # one format: stays 4-bit
    assert common_format([q, torch.zeros(3)]) is None


@pytest.mark.parametrize("kernel_class", [ZserveInt8DotKernel, Int8TorchKernel])
def test_weight_kernels_pack_the_stored_formats(kernel_class):
    if kernel_class is ZserveInt8DotKernel and not ZserveInt8DotKernel.runs(torch.device("cpu"), torch.float32):
        pytest.skip("the int8 x int8 kernel is not built here")
    from tests.model.test_gemm import make_weight

    for type_name in ("Q4_K", "Q6_K", "Q4_0"):
        _, weight = stored(type_name, rows=24, cols=256, seed=5)
        layer, _, _ = make_weight(256, 24, torch.float32, TorchKernel(), bias=False)
        layer.weight.data = weight.dequantize()
        layer.stored_parts = [(0, weight)]
        layer.pack(kernel_class())
        assert layer.packed.bits == (4 if kernel_class is ZserveInt8DotKernel and type_name != "Q6_K" else 8)
        x = random_rows(3, 256, seed=6)
        xq = fake_quantize(x).double() if kernel_class is ZserveInt8DotKernel else x.double()
        deq = weight.dequantize().double()
        assert_close_to_exact(layer.matmul(x, None), xq @ deq, xq.abs() @ deq.abs(), (kernel_class, type_name))


def test_int4_quantizer_round_trip_within_half_a_step():
    w = torch.randn(96, 40, generator=torch.Generator().manual_seed(7)) * torch.linspace(0.01, 2, 40)
    w[:32, 3] = 0.25  # a constant group: scale 0, the offset is the value
    weight = Int4Weight.quantize(w)
    assert weight.codes.dtype == torch.uint8 and int(weight.codes.max()) <= 15 and weight.group_size == 32
    step = weight.scales.repeat_interleave(32, dim=0)
    assert ((weight.dequantize() - w).abs() <= step / 2 * (1 + 1e-5) + 1e-6).all()
    assert float(weight.scales[0, 3]) == 0 and torch.equal(weight.dequantize()[:32, 3], torch.full((32,), 0.25))


def test_int4_quantization_picks_the_4_bit_path():
    from zserve.model_proc.layers.weight_kernels.registry import choose_kernel

    cpu = torch.device("cpu")
    for dtype in (torch.bfloat16, torch.float32):
        kernel = choose_kernel(cpu, dtype, "auto", "int4")
        assert kernel.weight_bits == 4, kernel
    assert ZserveInt8DotKernel(weight_bits=4).quantized(torch.randn(96, 8)).__class__ is Int4Weight
    assert ZserveInt8DotKernel(weight_bits=4).quantized(torch.randn(100, 8)).__class__ is Int8Weight  # K off 32
