"""The grouped low-rank product: for tokens of several adapters and none in one batch, each form of a LoRA layer
(lora_layer.py's dense products on every weight kernel, lora_rows_layer.py's CPU kernel) adds to each token exactly
its own adapter's x @ A^T @ B^T * alpha / r (per piece of a fused projection), and nothing when no token has an
adapter; the CPU kernel again at every lower instruction set this CPU runs (its AVX2 and scalar loops)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from zserve.model_proc.kernels.cpu_kernels import load_lora_rows
from zserve.model_proc.layers.weight_kernels.float_kernels import OneDnnKernel, ZserveBf16Kernel, onednn_supports
from zserve.model_proc.layers.weight_kernels.row_split_kernel import RowSplitBf16Kernel
from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.lora.lora_layer import LoraLayer
from zserve.model_proc.lora.lora_rows_layer import LoraRowsLayer

# the kernels the products may run on: torch's (None), oneDNN's whose post-ops fuse the mask and the add
# (lora_matrix.py), and zserve_bf16+onednn on either side of its row split
KERNELS = {
    "torch": None,
    "onednn": OneDnnKernel(),
    "row_split_onednn": RowSplitBf16Kernel(min_onednn_rows=1),
    "row_split_zserve_bf16": RowSplitBf16Kernel(min_onednn_rows=1 << 30),
}


ROWS_KERNEL = "lora_rows_kernel"  # lora_rows_layer.py's form instead of the dense products


def build_layer(form: str, updates, in_features: int, out_sizes: list[int], rank: int, batch: LoraBatch):
    if form == ROWS_KERNEL:
        lora_rows = load_lora_rows(batch.device, batch.dtype)
        if lora_rows is None:
            pytest.skip("zserve's CPU kernels are not built here")
        return LoraRowsLayer.build(updates, in_features, out_sizes, rank, batch, lora_rows)
    return LoraLayer.build(updates, in_features, out_sizes, rank, batch, kernel_or_skip(form, batch.dtype))


def kernel_or_skip(name: str, dtype: torch.dtype):
    kernel = KERNELS[name]
    if kernel is None:
        return None
    if not onednn_supports(dtype) or (isinstance(kernel, RowSplitBf16Kernel) and not ZserveBf16Kernel.runs(
            torch.device("cpu"), dtype)):
        pytest.skip(f"{name} does not run {dtype} on this CPU")
    return kernel


# the step's tokens' adapters (-1: the base model)
TOKEN_MIXES = {
    "interleaved": [1, -1, 0, 1, -1, 0, 0],
    "an_adapter_absent": [0, 0, -1, 0],
    "all_on_one_adapter": [1, 1, 1, 1, 1],
    "one_token": [1],
    # enough work for the CPU kernel to split its blocks over threads (lora_rows.cpp's FLOPS_PER_THREAD)
    "many_tokens": [t % 3 - 1 for t in range(64)],
}


# (in_features, the fused pieces' output sizes, each adapter's rank): a tiny projection (every kernel loop's tail)
# and the demo model's q/k/v (the kernel's full vectors and tiles)
SHAPES = {
    "tiny": (16, [8, 4, 4], [2, 4]),
    "qkv_576": (576, [576, 192, 192], [16, 8]),
    "odd": (40, [70], [3, 5]),
}


# (form, shape): the dense products' weight kernels on the tiny shape, torch's and the CPU kernel on every shape
FORMS_AND_SHAPES = [(form, "tiny") for form in KERNELS if form != "torch"] + [
    (form, shape) for form in ("torch", ROWS_KERNEL) for shape in SHAPES
]


@pytest.mark.parametrize("mix", list(TOKEN_MIXES))
@pytest.mark.parametrize(("form", "shape"), FORMS_AND_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_token_gets_its_own_adapters_update(dtype, form, shape, mix):
    gen = torch.Generator().manual_seed(0)
    in_features, out_sizes, ranks = SHAPES[shape]
    updates = [[(torch.randn(r, in_features, generator=gen), torch.randn(size, r, generator=gen), 0.5 * (i + 1))
                if not (i == 1 and p == 1) else None for p, size in enumerate(out_sizes)] for i, r in enumerate(ranks)]
    batch = LoraBatch(len(ranks), dtype, torch.device("cpu"))
    layer = build_layer(form, updates, in_features, out_sizes, max(ranks), batch)
    token_adapters = np.array(TOKEN_MIXES[mix], np.int32)
    x = torch.randn(len(token_adapters), in_features, generator=gen)
    y = torch.randn(len(token_adapters), sum(out_sizes), generator=gen)
    batch.set_tokens(token_adapters)
    if mix == "interleaved" and shape == "tiny":
        assert batch.mask(2).tolist()[:2] == [[0, 0, 1, 1], [0, 0, 0, 0]]
        order, offsets = batch.groups
        assert order.tolist() == [2, 5, 6, 0, 3] and offsets.tolist() == [0, 3, 5]
    got = layer(y.clone().to(dtype), x.to(dtype)).float()
    want = y.clone()
    for t, adapter in enumerate(token_adapters.tolist()):
        if adapter < 0:
            continue
        col = 0
        for piece, size in zip(updates[adapter], out_sizes, strict=True):
            if piece is not None:
                a, b, scaling = piece
                want[t, col : col + size] += (x[t] @ a.T @ b.T) * scaling
            col += size
    tol = 1e-5 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(got, want, atol=tol * float(want.abs().max()), rtol=tol)
    batch.set_tokens(None)
    assert layer(y, x) is y  # no adapted token: the base output, untouched
    batch.set_tokens(np.full(3, -1, np.int32))
    assert batch.is_empty


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_refuses_malformed_operands(dtype):
    lora_rows = load_lora_rows(torch.device("cpu"), dtype)
    if lora_rows is None:
        pytest.skip("zserve's CPU kernels are not built here")
    gen = torch.Generator().manual_seed(1)
    updates = [[(torch.randn(4, 16, generator=gen), torch.randn(8, 4, generator=gen), 1.0)]]
    batch = LoraBatch(1, dtype, torch.device("cpu"))
    layer = LoraRowsLayer.build(updates, 16, [8], 4, batch, lora_rows)
    y, x = torch.zeros(2, 8, dtype=dtype), torch.zeros(2, 16, dtype=dtype)
    offsets = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="order names a row outside y"):
        lora_rows(y, x, layer.a, layer.b, torch.tensor([2], dtype=torch.int32), offsets, layer.out_offsets, 4)
    with pytest.raises(RuntimeError, match="one dtype"):
        lora_rows(y, x.double(), layer.a, layer.b, torch.tensor([0], dtype=torch.int32), offsets, layer.out_offsets, 4)
    with pytest.raises(RuntimeError, match="b \\[num_adapters, tiles, rank, 64\\]"):
        lora_rows(y, x, layer.a, layer.b[:, :, :2], torch.tensor([0], dtype=torch.int32), offsets, layer.out_offsets, 4)


@pytest.mark.timeout(3600)  # a kernel build per level, in a child: past the suite's 600 s when loaded
@pytest.mark.skipif(os.environ.get("ZSERVE_CPU_ISA") is not None, reason="run once, by the process with every feature")
def test_the_kernel_form_at_every_lower_level():
    """The CPU kernel's tests again at every narrower vector width this CPU runs: its AVX2 + FMA and scalar loops
    (a build each, cached for the suite's other lower-level runs)."""
    from tests.model.test_cpu_isa import rerun_at_old_levels

    rerun_at_old_levels(__file__, f"{ROWS_KERNEL} or malformed", other_widths_only=True, none_skipped=True)
