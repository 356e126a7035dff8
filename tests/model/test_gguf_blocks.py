"""A GGUF file's quantized matrices kept as stored (--quantization gguf): the block decoder
(model_proc/weights/gguf_blocks.py) against gguf's own dequantization, bit for bit, for every type it
keeps (Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 quantized by gguf; the K-quants and IQ4 types as random
blocks with valid scales, which gguf cannot quantize to; every type as random bytes with any
finite fp16 fields, several shapes); its traits table against gguf's block sizes; the 4-bit kernel zserve::gemm_int4_dot and the int8 one
with offsets and groups of 16 against the exact product of the quantized activations and the
dequantized weights; and the pieces of a fused weight in two formats joined exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from testing.gguf_fixtures import QUANTIZED_TYPES, quantized_tensor
from testing.gguf_random_blocks import random_blocks
from tests.model.test_gemm_int8_dot import assert_close_to_exact, needs_kernel, random_rows
from zserve.model_proc.layers.int8_activations import fake_quantize
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8TorchKernel, ZserveInt8DotKernel
from zserve.model_proc.weights.column_blocks import pack_column_blocks, pack_int4_nibbles, pack_int8_quads
from zserve.model_proc.weights.gguf_blocks import BLOCK_TYPES, STORED_TYPES, block_type, decode, file_bytes
from zserve.model_proc.weights.int4_weights import Int4Weight, common_format
from zserve.model_proc.weights.int8_weights import Int8Weight
from zserve.model_proc.weights.quantized_weight import join_columns

ROWS, COLS = 40, 512  # two K-quant super-blocks per row
SHAPES = [(1, 256), (ROWS, COLS), (7, 768)]


def as_weight(type_name: str, raw: np.ndarray, rows: int, cols: int) -> Int8Weight | Int4Weight:
    """The decoded [rows, cols] matrix as the [in, out] weight the reader hands the layers."""
    b = decode(type_name, raw, rows, cols)
    offsets = None if b.offsets is None else b.offsets.t().contiguous()
    if b.bits == 4:
        return Int4Weight(b.codes.t().contiguous(), b.scales.t().contiguous(), offsets, b.group_size)
    return Int8Weight(b.codes.t().contiguous(), b.scales.t().contiguous(), b.group_size, offsets)


def stored(type_name: str, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> tuple[np.ndarray, Int8Weight | Int4Weight]:
    """Blocks quantized by gguf or the fixture's random K-quant blocks, else random blocks of values within +-0.05."""
    if type_name not in QUANTIZED_TYPES:
        raw = random_blocks(type_name, rows, cols, seed=seed, magnitude=0.05)
        return raw, as_weight(type_name, raw, rows, cols)
    data = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    raw, _ = quantized_tensor(type_name, data, seed=seed)
    return raw, as_weight(type_name, raw, rows, cols)


def assert_gguf_dequantizes_to(type_name: str, raw: np.ndarray, weight: Int8Weight | Int4Weight) -> None:
    import gguf

    rows, cols = weight.out_features, weight.dequantize().shape[0]
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(rows, cols)
    ours = weight.dequantize().t().contiguous().numpy()
    assert ours.dtype == np.float32 and np.isfinite(theirs).all()
    # bits compared up to the sign of zero (adding +0 makes -0 +0): gguf's Q4_0 d (8 - 8) is -0 for a negative d, 8 d - 8 d is +0
    ours, theirs = ours + np.float32(0), theirs + np.float32(0)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), float(np.abs(ours - theirs).max())


@pytest.mark.parametrize("type_name", STORED_TYPES)
def test_decoded_blocks_equal_gguf_dequantization_bit_for_bit(type_name):
    raw, weight = stored(type_name)
    assert_gguf_dequantizes_to(type_name, raw, weight)
    traits = block_type(type_name)
    assert type(weight) is (Int4Weight if traits.code_bits == 4 else Int8Weight)
    assert weight.group_size == traits.group_size and (weight.offsets is not None) == traits.has_offsets
    if isinstance(weight, Int4Weight):
        assert int(weight.codes.max()) <= 15 and weight.codes.dtype == torch.uint8
    else:
        assert weight.q.dtype == torch.int8 and int(weight.q.min()) > -128  # the avx2 path takes |C|


@pytest.mark.parametrize("type_name", STORED_TYPES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_random_bytes_decode_as_gguf_dequantizes_them(type_name, rows, cols):
    """Any bits (finite fp16 fields of any magnitude): the products round as gguf's do."""
    raw = random_blocks(type_name, rows, cols, seed=rows + cols)
    assert_gguf_dequantizes_to(type_name, raw, as_weight(type_name, raw, rows, cols))


def test_traits_table_matches_gguf_block_sizes():
    import gguf

    for name, traits in BLOCK_TYPES.items():
        qtype = gguf.GGMLQuantizationType[name]
        assert (traits.num_block_values, traits.num_block_bytes) == gguf.GGML_QUANT_SIZES[qtype], name
        assert file_bytes(name, 4 * traits.num_block_values) == 4 * traits.num_block_bytes
    assert BLOCK_TYPES["Q2_K"].file_bytes_per_weight == 84 / 256
    assert file_bytes("F16", 10) == 20 and file_bytes("IQ2_XXS", 512) == 2 * 66  # types not kept: gguf's sizes


def test_resident_bytes_are_what_the_kernel_packs():
    kernel = ZserveInt8DotKernel()
    for type_name in STORED_TYPES:
        _, weight = stored(type_name, rows=32, cols=256, seed=8)
        packed = kernel.pack(weight.dequantize(), None, weight)
        num_bytes = kernel.weight_bytes(packed, 256, 32, torch.float32)
        assert num_bytes == block_type(type_name).resident_bytes_per_weight * 256 * 32, type_name


def test_decoding_rejects_other_types_and_sizes():
    with pytest.raises(ValueError, match="GGUF type IQ2_XXS is not kept as stored"):
        decode("IQ2_XXS", np.zeros(66, np.uint8), 1, 256)
    with pytest.raises(ValueError, match=r"84 bytes are no \[1, 512\] Q2_K matrix"):
        decode("Q2_K", np.zeros(84, np.uint8), 1, 512)


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


def test_a_fused_weight_of_low_bit_pieces_joins_exactly():
    """Q2_K's attention: q and k in Q2_K (int8 codes 0..3 with offsets, groups of 16), v in Q3_K
    (no offsets, groups of 16); an IQ4_XS and a Q4_K piece (groups of 32) join them at 16."""
    pieces = [stored(t, rows=16, cols=256, seed=10 + i)[1] for i, t in enumerate(("Q2_K", "Q2_K", "Q3_K", "IQ4_XS", "Q4_K"))]
    joined = join_columns([(16 * i, p) for i, p in enumerate(pieces)], 80)
    assert isinstance(joined, Int8Weight) and joined.group_size == 16 and joined.offsets is not None
    assert torch.equal(joined.dequantize(), torch.cat([p.dequantize() for p in pieces], dim=1))


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

    for type_name in ("Q4_K", "Q6_K", "Q4_0", "Q2_K", "Q3_K", "IQ4_XS"):
        _, weight = stored(type_name, rows=24, cols=256, seed=5)
        layer, _, _ = make_weight(256, 24, torch.float32, TorchKernel(), bias=False)
        layer.weight.data = weight.dequantize()
        layer.stored_parts = [(0, weight)]
        layer.pack(kernel_class())
        assert layer.packed.bits == (block_type(type_name).code_bits if kernel_class is ZserveInt8DotKernel else 8)
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
