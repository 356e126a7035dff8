"""The linear-layer weight kernels (model_proc/layers/weight_kernels/) against an fp32 reference.

Every kernel sums in fp32 and rounds once, so each output must equal the fp32 product of the
same bf16/fp32 inputs rounded to the output dtype, up to one ulp (summation order); in bf16 the
zserve kernel must also stay within one ulp of torch.mm, and differ from it only rarely.
"""

from __future__ import annotations

import pytest
import torch

from zserve.model_proc.kernels.cpu_isa import cpu_isa
from zserve.model_proc.kernels.cpu_kernels import load_gemm_bf16, load_gemm_widen
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.weight_kernels.float_kernels import (
    OneDnnKernel,
    ZserveBf16Kernel,
    ZserveWidenKernel,
    onednn_supports,
)
from zserve.model_proc.layers.weight_kernels.registry import KERNELS, choose_kernel
from zserve.model_proc.layers.weight_kernels.row_split_kernel import (
    CALIBRATION_ROWS,
    NEVER,
    RowSplitBf16Kernel,
    measure_crossover,
)
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.weights.column_blocks import pack_bf16_blocks, pack_column_blocks

CPU = torch.device("cpu")
SHAPES = [(64, 96), (576, 960), (34, 7), (96, 600), (1536, 576), (2, 16), (40, 33)]  # (in, out): odd and tiny outs too
ROWS = [1, 3, 8, 9, 17, 64, 130]


NO_GEMM_BF16 = f"the VDPBF16PS GEMM needs the avx512_bf16 feature (this process: {cpu_isa()}) and a built extension"
NO_GEMM_WIDEN = f"the widening GEMM needs the avx2 feature (this process: {cpu_isa()}) and a built extension"


def kernels(dtype: torch.dtype) -> list[WeightKernel]:
    """Every unquantized kernel this CPU runs for `dtype` (each is tested where it runs)."""
    return [k for k in KERNELS if k.quantization == "none" and k.runs(CPU, dtype)]


def make_weight(in_features: int, out_features: int, dtype: torch.dtype, kernel: WeightKernel, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    class Layer(GemmWeight):
        pass

    layer = Layer()
    layer.init_weight(in_features, out_features)
    layer.weight.data = torch.randn(in_features, out_features, generator=g).to(dtype)
    layer.bias = torch.nn.Parameter(torch.randn(out_features, generator=g).to(dtype), requires_grad=False) if bias else None
    plain, plain_bias = layer.weight.detach().clone(), layer.bias
    layer.pack(kernel)
    return layer, plain, plain_bias


def ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of the output dtype at each value (one ulp), as float32."""
    bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[x.dtype]
    mag = x.float().abs().clamp_min(torch.finfo(x.dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - bits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_matches_the_fp32_product(dtype, bias):
    for kernel in kernels(dtype):
        backend = kernel.name
        for in_features, out_features in SHAPES:
            layer, plain, plain_bias = make_weight(in_features, out_features, dtype, kernel, bias)
            assert layer.kernel == kernel and (layer.weight is None) == kernel.repacks
            for rows in ROWS:
                x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
                y = layer.matmul(x, plain_bias)
                exact = x.double() @ plain.double() + (plain_bias.double() if bias else 0)
                assert y.shape == (rows, out_features) and y.dtype == dtype, (backend, y.shape)
                err = (y.double() - exact).abs()
                # rounding once to the dtype is half an ulp; different fp32 summation orders add a little
                limit = ulp(exact.to(dtype)).double() + 1e-5 * exact.abs().max()
                assert (err <= limit).all(), (backend, in_features, out_features, rows, float(err.max()))


@pytest.mark.skipif(load_gemm_bf16() is None, reason=NO_GEMM_BF16)
def test_zserve_bf16_next_to_torch_mm():
    """Measured: 0 to 3e-4 of the outputs differ from torch.mm's, by one ulp. The share is counted over
    all row counts of a shape: one small batch of 1,152 outputs may hold 2 such ties (0.0017) by chance."""
    for in_features, out_features in [(576, 960), (1536, 576), (576, 4096)]:
        layer, plain, _ = make_weight(in_features, out_features, torch.bfloat16, ZserveBf16Kernel(), bias=False)
        num_differ = num_outputs = 0
        for rows in (1, 2, 8, 64, 200):
            x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
            ours, theirs = layer.matmul(x, None), torch.mm(x, plain)
            num_differ += int((ours != theirs).sum())
            num_outputs += ours.numel()
            # one ulp of the larger of the two, plus fp32 summation error where terms cancel
            larger = torch.maximum(ours.float().abs(), theirs.float().abs()).to(torch.bfloat16)
            limit = ulp(larger) * 1.01 + 1e-5 * (x.float().abs() @ plain.float().abs())
            assert ((ours.float() - theirs.float()).abs() <= limit).all()
        assert num_differ / num_outputs < 1e-3, (in_features, out_features, num_differ, num_outputs)


@pytest.mark.skipif(load_gemm_widen() is None, reason=NO_GEMM_WIDEN)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_zserve_widen_next_to_torch_mm(dtype):
    """Same products, fp32 sums in another order: outputs within one ulp of torch.mm's, and
    equal to the exact product rounded once for nearly all of them."""
    for in_features, out_features in [(576, 960), (1536, 576), (576, 4096), (33, 40)]:
        layer, plain, _ = make_weight(in_features, out_features, dtype, ZserveWidenKernel(), bias=False)
        for rows in (1, 2, 3, 4, 5, 7, 8, 64, 200):
            x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
            ours = layer.matmul(x, None)
            exact = (x.double() @ plain.double()).to(dtype)
            assert (ours != exact).float().mean() < 1e-2, (in_features, out_features, rows)  # measured: under 0.6%
            theirs = torch.mm(x.float(), plain.float()).to(dtype)  # what torch.mm does in fp32, rounded once
            larger = torch.maximum(ours.float().abs(), theirs.float().abs()).to(dtype)
            limit = ulp(larger) * 1.01 + 1e-5 * (x.float().abs() @ plain.float().abs())
            assert ((ours.float() - theirs.float()).abs() <= limit).all(), (in_features, out_features, rows)


@pytest.mark.skipif(load_gemm_widen() is None, reason=NO_GEMM_WIDEN)
def test_zserve_widen_rejects_bad_inputs():
    layer, _, _ = make_weight(64, 96, torch.bfloat16, ZserveWidenKernel(), bias=False)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.zserve.gemm_widen(torch.zeros(2, 62, dtype=torch.bfloat16), layer.packed.values, 96, None)
    with pytest.raises(RuntimeError, match="dtype|bf16"):
        torch.ops.zserve.gemm_widen(torch.zeros(2, 64, dtype=torch.float16), layer.packed.values, 96, None)
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        torch.ops.zserve.gemm_widen(torch.zeros(2, 64), layer.packed.values, 96, None)
    with pytest.raises(RuntimeError, match="out_features"):
        torch.ops.zserve.gemm_widen(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed, 200, None)


def test_pack_widen_layout():
    """Block b, row k, column j holds W[k, 16b + j]; padding is zero."""
    w = torch.arange(3 * 20, dtype=torch.float32).view(3, 20).to(torch.float16)
    packed = pack_column_blocks(w)
    assert packed.shape == (2, 3, 16) and packed.dtype == torch.float16
    assert packed[1, 2, 3] == w[2, 19] and packed[0, 1, 15] == w[1, 15] and (packed[1, :, 4:] == 0).all()


@pytest.mark.skipif(load_gemm_bf16() is None, reason=NO_GEMM_BF16)
def test_zserve_bf16_rejects_bad_inputs():
    layer, _, _ = make_weight(64, 96, torch.bfloat16, ZserveBf16Kernel(), bias=False)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.zserve.gemm_bf16(torch.zeros(2, 62, dtype=torch.bfloat16), layer.packed.values, 96, None)
    with pytest.raises(RuntimeError, match="bf16"):
        torch.ops.zserve.gemm_bf16(torch.zeros(2, 64), layer.packed.values, 96, None)
    with pytest.raises(RuntimeError, match="out_features"):
        torch.ops.zserve.gemm_bf16(torch.zeros(2, 64, dtype=torch.bfloat16), layer.packed, 200, None)


def test_pack_layout():
    """Block b, pair p, column j holds (W[2p, 16b + j], W[2p + 1, 16b + j]); padding is zero."""
    w = torch.arange(6 * 20, dtype=torch.float32).view(6, 20).to(torch.bfloat16)
    packed = pack_bf16_blocks(w)
    assert packed.shape == (2, 3, 16) and packed.dtype == torch.int32
    pairs = packed.view(torch.bfloat16).view(2, 3, 16, 2)
    assert pairs[1, 2, 3, 0] == w[4, 19] and pairs[1, 2, 3, 1] == w[5, 19]
    assert pairs[0, 0, 0, 1] == w[1, 0] and (pairs[1, :, 4:] == 0).all()


@pytest.mark.parametrize("kernel", [ZserveBf16Kernel(), RowSplitBf16Kernel()], ids=lambda k: k.name)
def test_odd_in_features_fall_back_to_the_widening_gemm(kernel):
    if not kernel.runs(CPU, torch.bfloat16):
        pytest.skip(f"{kernel.name} does not run with this process's features ({cpu_isa()})")
    layer, plain, _ = make_weight(33, 40, torch.bfloat16, kernel, bias=False)
    assert layer.kernel == ZserveWidenKernel()
    x = torch.randn(3, 33).to(torch.bfloat16)
    assert torch.equal(layer.matmul(x, None), (x.double() @ plain.double()).to(torch.bfloat16))


@pytest.mark.skipif(not RowSplitBf16Kernel.runs(CPU, torch.bfloat16), reason=NO_GEMM_BF16 + ", and oneDNN's native bf16")
@pytest.mark.parametrize("bias", [False, True])
def test_the_row_split_kernel_runs_few_rows_on_zserve_bf16_and_many_on_onednn(bias):
    """Below min_onednn_rows a product is zserve_bf16's, bit for bit, from there oneDNN's (torch.mm's)."""
    split = RowSplitBf16Kernel(min_onednn_rows=9)
    layer, plain, plain_bias = make_weight(576, 960, torch.bfloat16, split, bias)
    few, _, _ = make_weight(576, 960, torch.bfloat16, ZserveBf16Kernel(), bias)
    many, _, _ = make_weight(576, 960, torch.bfloat16, OneDnnKernel(), bias)
    assert layer.packed_many_rows_values is not None  # counted with the model's buffers
    for rows in (1, 8, 9, 64):
        x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        expected = (few if rows < 9 else many).matmul(x, plain_bias)
        assert torch.equal(layer.matmul(x, plain_bias), expected), rows


@pytest.mark.skipif(not RowSplitBf16Kernel.runs(CPU, torch.bfloat16), reason=NO_GEMM_BF16 + ", and oneDNN's native bf16")
def test_the_crossover_is_measured_on_this_cpu():
    min_rows, timings = measure_crossover(repeats=1)
    assert min_rows in (*CALIBRATION_ROWS, NEVER)
    assert [int(part.split(":")[0]) for part in timings.split(", ")] == list(CALIBRATION_ROWS)
    assert RowSplitBf16Kernel().calibrated().min_onednn_rows in (*CALIBRATION_ROWS, NEVER)


def name_of(*args) -> str:
    return choose_kernel(*args).name


def test_backend_choice():
    widen = load_gemm_widen() is not None
    assert name_of(CPU, torch.float16) == ("zserve_widen" if widen else "torch")
    bf16_auto = ("zserve_bf16+onednn", "zserve_bf16", "zserve_widen") if widen else ("onednn", "torch")
    assert name_of(CPU, torch.bfloat16) in bf16_auto
    assert (name_of(CPU, torch.bfloat16) == "zserve_bf16+onednn") == RowSplitBf16Kernel.runs(CPU, torch.bfloat16)
    assert name_of(CPU, torch.bfloat16, "zserve_widen") == ("zserve_widen" if widen else "onednn" if onednn_supports(torch.bfloat16) else "torch")
    bf16_alone = "zserve_bf16" if load_gemm_bf16() is not None else "zserve_widen" if widen else "onednn"
    assert name_of(CPU, torch.bfloat16, "zserve_bf16") in (bf16_alone, "torch")
    assert name_of(CPU, torch.float32) == ("onednn" if onednn_supports(torch.float32) else "torch")
    assert name_of(torch.device("cuda"), torch.bfloat16) == "torch"
    assert name_of(CPU, torch.float32, "torch") == "torch"
    assert name_of(CPU, torch.bfloat16, "onednn") == ("onednn" if onednn_supports(torch.bfloat16) else "torch")
    with pytest.raises(ValueError, match="--gemm-backend 'bogus': expected one of"):
        name_of(CPU, torch.float32, "bogus")


@pytest.mark.skipif(not RowSplitBf16Kernel.runs(CPU, torch.bfloat16), reason=NO_GEMM_BF16 + ", and oneDNN's native bf16")
def test_the_row_split_keeps_one_copy_where_memory_is_short(model_dir, monkeypatch, caplog):
    """auto's second copy of the weights is taken only while it fits in a quarter of the free memory."""
    from testing.model_fixtures import make_runner
    from zserve.model_proc import model_runner

    monkeypatch.delenv("ZSERVE_GEMM", raising=False)
    settings = {"device": "cpu", "dtype": "bfloat16", "kv_cache_tokens": 256}
    assert make_runner(model_dir, **settings).gemm_backend == "zserve_bf16+onednn"
    monkeypatch.setattr(model_runner, "free_memory_bytes", lambda device: 1 << 10)
    with caplog.at_level("WARNING", logger="zserve.model_proc.model_runner"):
        runner = make_runner(model_dir, **settings)
    assert runner.gemm_backend == "zserve_bf16"
    assert "zserve_bf16+onednn would keep a second" in caplog.text and "zserve_bf16 instead (one copy" in caplog.text
    assert all(m.packed_many_rows_values is None for m in runner.model.modules() if hasattr(m, "packed_many_rows_values"))
