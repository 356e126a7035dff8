"""int8 weights times int8 activations: the activation quantizer (layers/int8_activations.py, and
the kernel's own, which must agree bit for bit), the kernel zserve::gemm_int8_dot
(kernels/gemm_int8_dot.cpp) and the weight kernel "zserve_int8_dot" against the exact product of
the quantized activations and the dequantized weights.

The kernel's int32 dot products are exact; the per-block rescale and the sums are fp32 and the
result is rounded once, so each output must equal the float64 product of `fake_quantize(x)` and
Q * S, rounded to the output dtype, up to half an ulp plus fp32 slack on the sum of |terms|.
tests/model/test_cpu_isa.py re-runs this file at smaller feature sets than this CPU's, one per int8
dot path: on a Sapphire Rapids VPDPBUSD zmm runs here and at `avx512+avx512_vnni`, VPDPBUSD ymm
(AVX-VNNI) at `avx2+avx_vnni`, VPMADDUBSW on zmm at `avx512` and on ymm at `avx2`; each path's
exact int32 sums make every output bit-identical to the others'.
"""

from __future__ import annotations

import pytest
import torch

from tests.model.test_gemm import make_weight, ulp
from zserve.model_proc.kernels.cpu_isa import cpu_isa, int8_dot_instruction
from zserve.model_proc.kernels.cpu_kernels import load_gemm_int8_dot
from zserve.model_proc.layers.int8_activations import ACT_BLOCK, fake_quantize, quantize_activations
from zserve.model_proc.layers.weight_kernels.float_kernels import TorchKernel
from zserve.model_proc.layers.weight_kernels.int8_kernels import ZserveInt8DotKernel, ZserveInt8Kernel
from zserve.model_proc.layers.weight_kernels.registry import choose_kernel
from zserve.model_proc.layers.weight_kernels.row_split_int8_kernel import RowSplitInt8Kernel
from zserve.model_proc.layers.weight_kernels.row_split_kernel import NEVER
from zserve.model_proc.weights.column_blocks import pack_column_blocks, pack_int8_quads, padded_bias
from zserve.model_proc.weights.int8_weights import Int8Weight, dequantize_int8, quantize_int8

CPU = torch.device("cpu")
ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 64]
SHAPES = [(32, 16), (64, 37), (96, 130), (576, 48)]  # (K, N): N off 16
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NO_KERNEL = f"the int8 x int8 GEMM needs the avx2 feature (this process: {cpu_isa()}) and a built extension"
needs_kernel = pytest.mark.skipif(load_gemm_int8_dot() is None, reason=NO_KERNEL)


def random_rows(rows: int, k: int, seed: int) -> torch.Tensor:
    """Rows whose blocks of 32 differ in scale by 10^4, with one block of zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 2, k // ACT_BLOCK).repeat_interleave(ACT_BLOCK)
    if k >= 2 * ACT_BLOCK:
        x[:, ACT_BLOCK : 2 * ACT_BLOCK] = 0
    return x


def assert_close_to_exact(y: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, what) -> None:
    err = (y.double() - exact).abs()
    limit = ulp(exact.to(y.dtype)).double() / 2 + 4e-6 * magnitude + 1e-30  # one rounding + fp32 rescale and sums
    assert (err <= limit).all(), (what, float(err.max()), float((err - limit).max()))


@needs_kernel
def test_the_build_reports_the_instruction_its_feature_set_chooses():
    granted = torch.ops.zserve.gemm_int8_dot_amx_granted()  # amx_int8 needs the OS's permission too
    assert torch.ops.zserve.gemm_int8_dot_instruction() == int8_dot_instruction(cpu_isa(), amx_granted=granted) != ""


def test_reference_quantizer_rule():
    x = random_rows(3, 128, seed=1)
    q, scales = quantize_activations(x)
    assert q.dtype == torch.int8 and scales.shape == (3, 4)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(scales[:, 1], torch.zeros(3)) and torch.equal(q[:, 32:64], torch.zeros(3, 32, dtype=torch.int8))
    step = scales.repeat_interleave(ACT_BLOCK, dim=1)
    assert ((fake_quantize(x) - x).abs() <= step / 2 * (1 + 1e-6)).all()
    ties = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5] + [0.0] * 26])  # scale 1: halves round to even
    assert quantize_activations(ties)[0][0, :6].tolist() == [127, 0, 2, 2, 0, -2]


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_kernel_quantizer_equals_the_reference_bit_for_bit(rows):
    for k in (32, 96, 576):
        x = random_rows(rows, k, seed=rows * k)
        q, scales = quantize_activations(x)
        kernel_q, kernel_scales, sums16 = torch.ops.zserve.quantize_activations(x)
        assert torch.equal(kernel_q, q) and torch.equal(kernel_scales, scales)
        assert torch.equal(sums16, q.view(rows, -1, 16).int().sum(-1))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 0])  # 0: one scale per output column
def test_kernel_equals_quantized_activations_times_dequantized_weights(dtype, group_size):
    for k, n in SHAPES:
        g = min(group_size, k) if group_size else k
        w = torch.randn(k, n, generator=torch.Generator().manual_seed(k * n))
        q, scales = quantize_int8(w, g)
        deq = dequantize_int8(q, scales, g).double()
        for with_bias in (False, True):
            bias = torch.randn(n, generator=torch.Generator().manual_seed(n)) if with_bias else None
            values = pack_int8_quads(q)
            packed_bias = padded_bias(bias, values.shape[0])
            for rows in ROWS:
                x = random_rows(rows, k, seed=rows).to(dtype)
                y = torch.ops.zserve.gemm_int8_dot(x, values, pack_column_blocks(scales), None, n, packed_bias, g)
                assert y.shape == (rows, n) and y.dtype == dtype
                xq = fake_quantize(x).double()
                exact = xq @ deq + (bias.double() if with_bias else 0)
                assert_close_to_exact(y, exact, xq.abs() @ deq.abs(), (dtype, g, k, n, rows, with_bias))


@needs_kernel
def test_extreme_codes_do_not_saturate():
    """Every weight code at -128 or 127 against activations at +-127: the VPMADDUBSW paths' 16-bit
    pairs stay below their saturation (a GGUF Q8_0 file may hold -128, which our quantizer never makes)."""
    k, n = 256, 32
    q = torch.where(torch.rand(k, n, generator=torch.Generator().manual_seed(3)) < 0.5, -128, 127).to(torch.int8)
    scales = torch.full((k // 32, n), 0.01)
    x = torch.where(torch.rand(4, k, generator=torch.Generator().manual_seed(4)) < 0.5, -1.0, 1.0)
    y = torch.ops.zserve.gemm_int8_dot(x, pack_int8_quads(q), pack_column_blocks(scales), None, n, None, 32)
    exact = fake_quantize(x).double() @ dequantize_int8(q, scales, 32).double()
    assert torch.allclose(y.double(), exact, rtol=1e-6, atol=1e-6)


@needs_kernel
def test_kernel_rejects_bad_inputs():
    q, scales = quantize_int8(torch.randn(64, 40), 32)
    values, packed_scales = pack_int8_quads(q), pack_column_blocks(scales)
    x = torch.randn(2, 64)
    gemm = torch.ops.zserve.gemm_int8_dot
    with pytest.raises(RuntimeError, match="x must be contiguous bf16, fp16 or fp32"):
        gemm(x.double(), values, packed_scales, None, 40, None, 32)
    with pytest.raises(RuntimeError, match="K must be a positive multiple of 32, got 48"):
        gemm(torch.randn(2, 48), values, packed_scales, None, 40, None, 32)
    with pytest.raises(RuntimeError, match=r"the codes must be contiguous uint8 \[NB, K / 4 = 16, 16, 4\]"):
        gemm(x, values.view(torch.int8), packed_scales, None, 40, None, 32)
    with pytest.raises(RuntimeError, match="out_features does not match"):
        gemm(x, values, packed_scales, None, 50, None, 32)
    with pytest.raises(RuntimeError, match="group_size must be K, 16 or a multiple of 32"):
        gemm(x, values, packed_scales, None, 40, None, 8)
    with pytest.raises(RuntimeError, match="bias must be contiguous float32"):
        gemm(x, values, packed_scales, None, 40, torch.zeros(40), 32)
    assert gemm(torch.empty(0, 64), values, packed_scales, None, 40, None, 32).shape == (0, 40)


ROW_SPLIT = RowSplitInt8Kernel.runs(CPU, torch.bfloat16)
needs_row_split = pytest.mark.skipif(not ROW_SPLIT, reason=NO_KERNEL + ", and oneDNN's native bf16")


@needs_kernel
def test_auto_picks_it_for_16_bit_dtypes_only():
    assert choose_kernel(CPU, torch.bfloat16, "auto", "int8").name == ("zserve_int8_dot+onednn" if ROW_SPLIT else "zserve_int8_dot")
    assert choose_kernel(CPU, torch.float16, "auto", "int8").name == "zserve_int8_dot"
    assert choose_kernel(CPU, torch.float32, "auto", "int8").name == "zserve_int8"  # fp32: exact activations
    assert choose_kernel(CPU, torch.float32, "zserve_dot", "int8").name == "zserve_int8_dot"
    assert choose_kernel(CPU, torch.bfloat16, "zserve_widen", "int8").name == "zserve_int8"


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_weight_packs_for_it_and_falls_back_off_32(dtype):
    for k, group_size, expected in ((96, 32, ZserveInt8DotKernel), (96, 0, ZserveInt8DotKernel), (100, 32, ZserveInt8Kernel)):
        layer, plain, _ = make_weight(k, 37, dtype, TorchKernel(), bias=True)
        layer.pack(ZserveInt8DotKernel(group_size=group_size))
        assert type(layer.kernel) is expected and layer.weight is None
        g = layer.packed.group_size
        deq = dequantize_int8(*quantize_int8(plain, g), g).double()
        for rows in (1, 9):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
            y = layer.matmul(x, layer.bias)
            xq = fake_quantize(x).double() if expected is ZserveInt8DotKernel else x.double()
            assert_close_to_exact(y, xq @ deq + layer.bias.double(), xq.abs() @ deq.abs(), (k, group_size, rows))


@needs_kernel
def test_a_stored_int8_weight_is_packed_as_it_came():
    w = torch.randn(64, 20, generator=torch.Generator().manual_seed(5))
    stored = Int8Weight.quantize(w, 32)
    packed = ZserveInt8DotKernel(group_size=64).pack(w * 3, None, stored)  # the plain values are not read
    assert packed.group_size == 32 and torch.equal(packed.values, pack_int8_quads(stored.q))
    with pytest.raises(ValueError, match="scales per 48 rows; it needs K, 16 or a multiple of 32"):
        ZserveInt8DotKernel().pack(torch.randn(96, 20), None, Int8Weight.quantize(torch.randn(96, 20), 48))


def test_quads_layout():
    q = torch.arange(-64, 64, dtype=torch.int8).view(8, 16)[:, :13]  # K 8, N 13
    quads = pack_int8_quads(q)
    assert quads.shape == (1, 2, 16, 4) and quads.dtype == torch.uint8
    assert int(quads[0, 1, 3, 2]) == int(q[6, 3]) + 128
    assert torch.equal(quads[0, :, 13:], torch.full((2, 3, 4), 128, dtype=torch.uint8))


@needs_row_split
def test_row_split_runs_few_rows_in_int8_and_many_in_bf16():
    k, n = 96, 40
    kernel = RowSplitInt8Kernel(group_size=32, min_onednn_rows=4)
    layer, plain, _ = make_weight(k, n, torch.bfloat16, TorchKernel(), bias=True)
    layer.pack(kernel)
    assert layer.kernel is kernel and layer.packed_many_rows_values is not None
    deq = dequantize_int8(*quantize_int8(plain, 32), 32)
    deq_bf16 = deq.to(torch.bfloat16).double()
    for rows in (1, 3, 4, 9):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        y = layer.matmul(x, layer.bias)
        xq = fake_quantize(x).double() if rows < 4 else x.double()
        w = deq.double() if rows < 4 else deq_bf16  # many rows: oneDNN on bf16(Q * S)
        assert_close_to_exact(y, xq @ w + layer.bias.double(), xq.abs() @ w.abs(), rows)


@needs_row_split
def test_row_split_falls_back_to_one_copy():
    kernel = RowSplitInt8Kernel(group_size=64)
    assert kernel.one_copy() == ZserveInt8DotKernel(group_size=64)
    assert kernel.kernel_for(96) is kernel and type(kernel.kernel_for(100)) is ZserveInt8Kernel
    never = RowSplitInt8Kernel(group_size=64, min_onednn_rows=NEVER)  # oneDNN never won: no bf16 copy
    assert never.kernel_for(96) == ZserveInt8DotKernel(group_size=64)
    calibrated = kernel.calibrated()
    assert 1 <= calibrated.min_onednn_rows and calibrated.group_size == 64


@needs_row_split
def test_the_runner_keeps_the_int8_copy_alone_where_memory_is_short(model_dir, monkeypatch, caplog):
    from testing.model_fixtures import make_runner
    from zserve.model_proc import model_runner

    monkeypatch.delenv("ZSERVE_GEMM", raising=False)
    settings = {"device": "cpu", "dtype": "bfloat16", "kv_cache_tokens": 256, "quantization": "int8"}
    assert make_runner(model_dir, **settings).gemm_backend == "zserve_int8_dot+onednn"
    monkeypatch.setattr(model_runner, "free_memory_bytes", lambda device: 1 << 10)
    with caplog.at_level("WARNING", logger="zserve.model_proc.model_runner"):
        runner = make_runner(model_dir, **settings)
    assert runner.gemm_backend == "zserve_int8_dot"
    assert "zserve_int8_dot instead (one copy" in caplog.text
    assert all(m.packed_many_rows_values is None for m in runner.model.modules() if hasattr(m, "packed_many_rows_values"))
