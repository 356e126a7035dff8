"""The grouped low-rank product: for tokens of several adapters and none in one batch, LoraLayer adds to each
token exactly its own adapter's x @ A^T @ B^T * alpha / r (per piece of a fused projection), and nothing when no
token has an adapter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zserve.model_proc.layers.weight_kernels.float_kernels import OneDnnKernel, ZserveBf16Kernel, onednn_supports
from zserve.model_proc.layers.weight_kernels.row_split_kernel import RowSplitBf16Kernel
from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.lora.lora_layer import LoraLayer

# the kernels the products may run on: torch's (None), oneDNN's whose post-ops fuse the mask and the add
# (lora_matrix.py), and zserve_bf16+onednn on either side of its row split
KERNELS = {
    "torch": None,
    "onednn": OneDnnKernel(),
    "row_split_onednn": RowSplitBf16Kernel(min_onednn_rows=1),
    "row_split_zserve_bf16": RowSplitBf16Kernel(min_onednn_rows=1 << 30),
}


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
}


@pytest.mark.parametrize("mix", list(TOKEN_MIXES))
@pytest.mark.parametrize("kernel_name", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_token_gets_its_own_adapters_update(dtype, kernel_name, mix):
    kernel = kernel_or_skip(kernel_name, dtype)
    gen = torch.Generator().manual_seed(0)
    in_features, out_sizes, ranks = 16, [8, 4, 4], [2, 4]
    updates = [[(torch.randn(r, in_features, generator=gen), torch.randn(size, r, generator=gen), 0.5 * (i + 1))
                if not (i == 1 and p == 1) else None for p, size in enumerate(out_sizes)] for i, r in enumerate(ranks)]
    batch = LoraBatch(len(ranks), dtype, torch.device("cpu"))
    layer = LoraLayer.build(updates, in_features, out_sizes, max(ranks), batch, kernel)
    token_adapters = np.array(TOKEN_MIXES[mix], np.int32)
    x = torch.randn(len(token_adapters), in_features, generator=gen)
    y = torch.randn(len(token_adapters), sum(out_sizes), generator=gen)
    batch.set_tokens(token_adapters)
    if mix == "interleaved":
        assert batch.mask(2).tolist()[:2] == [[0, 0, 1, 1], [0, 0, 0, 0]]
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
