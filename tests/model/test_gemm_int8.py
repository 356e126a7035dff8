"""int8 weights (--quantization int8): the quantizer (model_proc/weights/int8_weights.py), the
kernel zserve::gemm_int8 (kernels/gemm_int8.cpp) and the weight kernels "zserve_int8" and
"int8_torch" (layers/weight_kernels/int8_kernels.py) against the exact product of the dequantized
weights, and a weight a checkpoint stored in int8 (`Int8Weight`) packed as it came.

The kernel sums in fp32 and rounds once, so each output must equal the float64 product of x and
Q * S (the weight the int8 path stands for), rounded to the output dtype, up to half an ulp plus
fp32 summation slack. tests/model/test_cpu_isa.py re-runs this file at a smaller feature set (on an
AVX2 machine: `baseline`, where the kernel is absent and "int8_torch" runs instead).
"""

from __future__ import annotations

import pytest
import torch

from tests.model.test_gemm import make_weight, ulp
from zserve.model_proc.kernels.cpu_isa import cpu_isa
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8
from zserve.model_proc.layers.gemm import gemm_weight_bytes
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.int8_kernels import Int8Kernel, Int8TorchKernel, ZserveInt8Kernel
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel
from zserve.model_proc.weights.column_blocks import pack_column_blocks
from zserve.model_proc.weights.int8_weights import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    QMAX,
    Int8Weight,
    dequantize_int8,
    num_groups,
    quantize_int8,
)
from zserve.model_proc.weights.quantized_weight import join_columns

CPU = torch.device("cpu")
ROWS = [1, 2, 3, 4, 5, 7, 8, 13, 64]
SHAPES = [(100, 37), (200, 48), (64, 16), (576, 130), (7, 5)]  # (K, N): K off 16 and off the groups, N off 16
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NO_KERNEL = f"the int8 GEMM needs the avx2 feature (this process: {cpu_isa()}) and a built extension"


def assert_close_to_exact(y: torch.Tensor, exact: torch.Tensor, what) -> None:
    err = (y.double() - exact).abs()
    limit = ulp(exact.to(y.dtype)).double() / 2 + 2e-6 * exact.abs().max() + 1e-6  # one rounding + fp32 sums
    assert (err <= limit).all(), (what, float(err.max()), float(limit.max()))


def kernel_args(q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    packed = pack_column_blocks(q)
    padded_bias = None
    if bias is not None:
        padded_bias = torch.zeros(packed.shape[0] * 16)
        padded_bias[: bias.numel()] = bias
    return packed, pack_column_blocks(scales), padded_bias


@pytest.mark.parametrize("group_size", [*GROUP_SIZES, 0])  # 0: one scale per output column
def test_quantizer_round_trip_within_half_a_step(group_size):
    w = torch.randn(300, 70, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.01, 3, 70)
    w[:, 5] = 0  # an all-zero column: scale 0, values 0
    q, scales = quantize_int8(w, group_size)
    g = group_size or 300
    assert q.dtype == torch.int8 and q.shape == w.shape and scales.shape == (num_groups(300, g), 70)
    assert int(q.abs().max()) == QMAX and int(q.min()) >= -QMAX
    step = scales.repeat_interleave(g, dim=0)[:300]
    deq = dequantize_int8(q, scales, g)
    assert ((w - deq).abs() <= step / 2 * (1 + 1e-6) + 1e-12).all()
    assert torch.equal(deq[:, 5], torch.zeros(300))


@pytest.mark.skipif(load_gemm_int8() is None, reason=NO_KERNEL)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [*GROUP_SIZES, 0])
def test_kernel_matches_the_product_of_the_dequantized_weights(dtype, group_size):
    for k, n in SHAPES:
        g = min(group_size, k) if group_size else k
        w = torch.randn(k, n, generator=torch.Generator().manual_seed(k * n))
        q, scales = quantize_int8(w, g)
        deq = dequantize_int8(q, scales, g).double()
        for with_bias in (False, True):
            bias = torch.randn(n, generator=torch.Generator().manual_seed(n)) if with_bias else None
            packed, packed_scales, padded_bias = kernel_args(q, scales, bias)
            for rows in ROWS:
                x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
                y = torch.ops.zserve.gemm_int8(x, packed, packed_scales, n, padded_bias, g)
                assert y.shape == (rows, n) and y.dtype == dtype
                exact = x.double() @ deq + (bias.double() if with_bias else 0)
                assert_close_to_exact(y, exact, (dtype, g, k, n, rows, with_bias))


@pytest.mark.skipif(load_gemm_int8() is None, reason=NO_KERNEL)
def test_kernel_rejects_bad_inputs():
    q, scales = quantize_int8(torch.randn(64, 40), 32)
    packed, packed_scales, _ = kernel_args(q, scales, None)
    x = torch.randn(2, 64)
    gemm = torch.ops.zserve.gemm_int8
    with pytest.raises(RuntimeError, match="x must be contiguous bf16, fp16 or fp32"):
        gemm(x.double(), packed, packed_scales, 40, None, 32)
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        gemm(torch.randn(64, 2).t(), packed, packed_scales, 40, None, 32)
    with pytest.raises(RuntimeError, match="w_packed must be contiguous int8"):
        gemm(x, packed.to(torch.int16), packed_scales, 40, None, 32)
    with pytest.raises(RuntimeError, match="x has 63 columns, the weight 64 rows"):
        gemm(torch.randn(2, 63), packed, packed_scales, 40, None, 32)
    with pytest.raises(RuntimeError, match="out_features does not match"):
        gemm(x, packed, packed_scales, 50, None, 32)
    with pytest.raises(RuntimeError, match="group_size must be in"):
        gemm(x, packed, packed_scales, 40, None, 0)
    with pytest.raises(RuntimeError, match=r"scales must be contiguous float32 \[NB, ceil\(K / group_size\) = 4, 16\]"):
        gemm(x, packed, packed_scales, 40, None, 16)
    with pytest.raises(RuntimeError, match="bias must be contiguous float32"):
        gemm(x, packed, packed_scales, 40, torch.zeros(40), 32)


INT8_KERNELS = (ZserveInt8Kernel, Int8TorchKernel)


def int8_layer(k: int, n: int, dtype: torch.dtype, kernel: Int8Kernel, bias: bool):
    layer, plain, _ = make_weight(k, n, dtype, TorchKernel(), bias)  # torch: left plain
    layer.pack(kernel)
    return layer, plain


@pytest.mark.parametrize("kernel_class", INT8_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_weight_int8_kernels(kernel_class, dtype):
    if kernel_class is ZserveInt8Kernel and load_gemm_int8() is None:
        pytest.skip(NO_KERNEL)
    for group_size, expect_group in ((DEFAULT_GROUP_SIZE, 64), (32, 32), (0, 200), (500, 200)):
        kernel = kernel_class(group_size=group_size)
        layer, plain = int8_layer(200, 37, dtype, kernel, bias=True)
        assert layer.weight is None and layer.kernel == kernel and layer.packed.group_size == expect_group
        q, scales = quantize_int8(plain, expect_group)
        deq = dequantize_int8(q, scales, expect_group).double()
        for rows in (1, 5, 9):
            x = torch.randn(rows, 200, generator=torch.Generator().manual_seed(rows)).to(dtype)
            y = layer.matmul(x, layer.bias)
            assert y.dtype == dtype
            assert_close_to_exact(y, x.double() @ deq + layer.bias.double(), (kernel, rows))
        assert layer.weight_bytes(dtype) == 200 * 37 + num_groups(200, expect_group) * 37 * 4


class CopyOnly:
    """The two Checkpoint methods `fill_weight` calls."""

    def copy_into(self, param, tensor, name, row_offset=0, transposed=False):
        with torch.no_grad():
            param.t()[row_offset : row_offset + tensor.shape[0]].copy_(tensor)

    def mark_loaded(self, param):
        pass


@pytest.mark.parametrize("kernel_class", INT8_KERNELS)
def test_a_weight_stored_in_int8_is_packed_as_it_came(kernel_class):
    """Two pieces of a fused weight (q, k) a checkpoint stored in groups of 32 (GGUF Q8_0):
    packed as stored, group 32, not quantized again; a piece in floats among them makes the layer
    dequantize the stored one into its float weight at `pack` and quantize that instead; a piece in groups of 64 joins in groups of 32 (its scales
    repeated: the same values)."""
    if kernel_class is ZserveInt8Kernel and load_gemm_int8() is None:
        pytest.skip(NO_KERNEL)
    w = torch.randn(96, 40, generator=torch.Generator().manual_seed(3))
    q_part, k_part = Int8Weight.quantize(w[:, :24], 32), Int8Weight.quantize(w[:, 24:], 32)
    assert join_columns([(0, q_part)], 40) is None and join_columns([(0, q_part), (30, k_part)], 40) is None
    regrouped = join_columns([(0, q_part), (24, Int8Weight.quantize(w[:, 24:], 64))], 40)
    assert regrouped.group_size == 32
    assert torch.equal(regrouped.dequantize(), torch.cat([q_part.dequantize(), Int8Weight.quantize(w[:, 24:], 64).dequantize()], 1))
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(4))
    for second, expect_group in ((k_part, 32), (k_part.dequantize(), DEFAULT_GROUP_SIZE)):
        layer, _, _ = make_weight(96, 40, torch.float32, TorchKernel(), bias=False)
        layer.fill_weight(CopyOnly(), q_part, "q")
        layer.fill_weight(CopyOnly(), second if isinstance(second, Int8Weight) else second.t(), "k", col_offset=24)
        assert len(layer.stored_parts) == (2 if expect_group == 32 else 1)  # stored pieces kept, never dequantized
        plain = torch.cat([q_part.dequantize(), k_part.dequantize()], dim=1)  # what the float kernels' quantizer sees
        layer.pack(kernel_class())
        assert layer.packed.group_size == expect_group and not layer.stored_parts
        weight = join_columns([(0, q_part), (24, k_part)], 40) if expect_group == 32 else Int8Weight.quantize(plain, expect_group)
        assert_close_to_exact(layer.matmul(x, None), x.double() @ weight.dequantize().double(), (kernel_class, expect_group))


def test_backend_choice_and_bytes():
    kernel = load_gemm_int8() is not None
    for dtype in DTYPES:  # 16-bit dtypes: the int8 x int8 kernel (test_gemm_int8_dot.py), same build condition
        expected = ("zserve_int8" if dtype == torch.float32 else "zserve_int8_dot") if kernel else "int8_torch"
        assert choose_kernel(CPU, dtype, "auto", "int8").name.removesuffix("+onednn") == expected
        assert choose_kernel(CPU, dtype, "zserve_widen", "int8").name == ("zserve_int8" if kernel else "int8_torch")
    assert choose_kernel(CPU, torch.bfloat16, "torch", "int8").name == "int8_torch"
    assert choose_kernel(torch.device("cuda"), torch.bfloat16, "auto", "int8").name == "int8_torch"
    with pytest.raises(ValueError, match="--quantization 'int3': expected one of none, int8, int4, gguf"):
        choose_kernel(CPU, torch.bfloat16, "auto", "int3")
    model = torch.nn.ModuleList([int8_layer(128, 48, torch.bfloat16, Int8TorchKernel(group_size=64), bias=False)[0]])
    assert gemm_weight_bytes(model, torch.bfloat16) == 128 * 48 + 2 * 48 * 4  # vs 128 * 48 * 2 in bf16
