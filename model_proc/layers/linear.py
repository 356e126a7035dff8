"""Linear layers split for tensor parallelism (Megatron style).

    column parallel: W [out, in] split by output rows; each rank computes its slice of y, no communication
    row parallel:    W [out, in] split by input columns; each rank computes a partial y, then all-reduce

A column-parallel layer may fuse several logical outputs into one matmul (q, k, v or gate, up);
each output is split across ranks separately, so rank r's outputs are [q_r | k_r | v_r].

Weights load transposed, [in, out] (GPT-2's Conv1D layout), and apply as x @ W (gemm.py): on
CPU, MKL streams a weight ~1.3-1.8x faster through a batch-1 fp32 GEMV in this layout than
through F.linear's [out, in] one. The runner then packs them for the chosen weight kernel
(weight_kernels/), which on CPU is faster again in fp32 and bf16. Decode is bound by reading the
weights, so this is the main cost of a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.parallel import all_reduce, shard_range


class ColumnParallelLinear(GemmWeight):
    def __init__(self, in_features: int, out_sizes: Sequence[int], bias: bool, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.in_features = in_features
        self.out_sizes = list(out_sizes)  # full (all ranks) size of each fused output
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.local_sizes = [size // tp_size for size in self.out_sizes]
        self.init_weight(in_features, sum(self.local_sizes))
        self.bias = nn.Parameter(torch.empty(sum(self.local_sizes)), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)  # [T, in] -> [T, sum(local_sizes)]

    def load(self, ckpt: Checkpoint, prefixes: Sequence[str], transpose: bool = False) -> None:
        """One checkpoint tensor per fused output (`q_proj`, `k_proj`, `v_proj`), or a single
        tensor holding all of them stacked (GPT-2's `c_attn`). `transpose`: stored [in, out]."""
        fused_on_disk = len(prefixes) == 1 and len(self.out_sizes) > 1
        assert fused_on_disk or len(prefixes) == len(self.out_sizes), (prefixes, self.out_sizes)
        file_offset, local_offset = 0, 0
        for i, size in enumerate(self.out_sizes):
            prefix = prefixes[0] if fused_on_disk else prefixes[i]
            full_rows = sum(self.out_sizes) if fused_on_disk else size
            r0, r1 = shard_range(size, self.tp_rank, self.tp_size)
            rows = (file_offset + r0, file_offset + r1)
            weight = ckpt.read_weight(f"{prefix}.weight", (full_rows, self.in_features), rows=rows, transpose=transpose)
            self.fill_weight(ckpt, weight, f"{prefix}.weight", col_offset=local_offset)
            if self.bias is not None:
                bias = ckpt.read(f"{prefix}.bias", (full_rows,), rows=rows)
                ckpt.copy_into(self.bias, bias, f"{prefix}.bias", row_offset=local_offset)
            file_offset += size if fused_on_disk else 0
            local_offset += r1 - r0
        self.loaded()


class RowParallelLinear(GemmWeight):
    def __init__(self, in_features: int, out_features: int, bias: bool, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.init_weight(in_features // tp_size, out_features)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [T, in / tp] -> [T, out]; the bias is added once, by rank 0, before the sum over ranks
        y = self.matmul(x, self.bias if self.tp_rank == 0 else None)
        return all_reduce(y, self.tp_size)

    def load(self, ckpt: Checkpoint, prefix: str, transpose: bool = False) -> None:
        cols = shard_range(self.in_features, self.tp_rank, self.tp_size)
        shape = (self.out_features, self.in_features)
        weight = ckpt.read_weight(f"{prefix}.weight", shape, cols=cols, transpose=transpose)
        self.fill_weight(ckpt, weight, f"{prefix}.weight")
        if self.bias is not None:
            ckpt.copy_into(self.bias, ckpt.read(f"{prefix}.bias", (self.out_features,)), f"{prefix}.bias")
        self.loaded()
