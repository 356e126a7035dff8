"""LoraRowsLayer: every loaded adapter's low-rank update of one projection, on the CPU: one call into
zserve::lora_rows_ (kernels/lora_rows.cpp) per projection and step, each adapted token on its own adapter's
matrices only (Punica's grouped product as SGMV runs it: the step's rows grouped by adapter, LoraBatch.groups).

    for each adapter i present, each of its tokens t:   h = x[t] @ a[i]                  (fp32)
                                                        y[t, piece p] += h[p's rank] @ b[i, p's rank, p's columns]

The matrices are lora_stack.py's in the kernel's layout, in the model's dtype: a [num_adapters, width, in_padded]
(A's rows, as PEFT stores them: `in` padded to 16, the rows to 4), b [num_adapters, tiles, rank, 64] (each piece's B
rows in tiles of 64 columns, so the kernel streams both in memory order; only the pieces' blocks, not the zeros
between them). Against the dense form (lora_layer.py: every token against every adapter, masked, two oneDNN products
per projection) it does a quarter of the FLOPs in a batch of three adapters and the base model, reads only the
adapters present and only a fused b's non-zero blocks, and makes one call instead of two: the dense form's
products cost by the call at decode's few rows (BENCHMARKS.md section 33).
y is the projection's fresh output (the weight kernels allocate it): updated in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.lora.lora_stack import Update, stack_updates

# lora_rows.cpp's layout
TILE_COLUMNS = 64  # b's columns per tile
ROW_MULTIPLE = 4  # a's rows per adapter: a multiple of this
IN_MULTIPLE = 16  # a's row length: `in` padded to a multiple of this


class LoraRowsLayer(nn.Module):
    def __init__(self, a: torch.Tensor, b: torch.Tensor, out_sizes: list[int], rank: int, batch: LoraBatch,
                 lora_rows: Callable):
        super().__init__()
        self.register_buffer("a", a, persistent=False)  # [num_adapters, width, in_padded]
        self.register_buffer("b", b, persistent=False)  # [num_adapters, tiles, rank, TILE_COLUMNS]
        self.out_offsets = torch.tensor([0, *torch.tensor(out_sizes).cumsum(0).tolist()], dtype=torch.int64)
        self.rank = rank  # a's columns (b's rows) per piece
        self.batch = batch  # the runner's: which adapter each token of the step belongs to
        self.lora_rows = lora_rows  # torch.ops.zserve.lora_rows_

    @staticmethod
    def build(pieces: list[list[Update | None]], in_features: int, out_sizes: list[int], rank: int,
              batch: LoraBatch, lora_rows: Callable) -> LoraRowsLayer:
        """`pieces[i][p]`: adapter i's update of piece p of the projection, or None."""
        stacked_a, stacked_b = stack_updates(pieces, in_features, out_sizes, rank, len(out_sizes) * rank)
        num_adapters = len(pieces)
        a = torch.zeros(num_adapters, round_up(len(out_sizes) * rank, ROW_MULTIPLE), round_up(in_features, IN_MULTIPLE))
        a[:, : len(out_sizes) * rank, :in_features] = stacked_a.transpose(1, 2)
        tiles, first = [], 0
        for p, size in enumerate(out_sizes):
            block = torch.zeros(num_adapters, rank, round_up(size, TILE_COLUMNS))
            block[:, :, :size] = stacked_b[:, p * rank : (p + 1) * rank, first : first + size]
            tiles.append(block.view(num_adapters, rank, -1, TILE_COLUMNS).transpose(1, 2))
            first += size
        b = torch.cat(tiles, dim=1)
        return LoraRowsLayer(a.to(batch.dtype).contiguous(), b.to(batch.dtype).contiguous(), out_sizes, rank, batch,
                             lora_rows)

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y ([T, out], the base projection of x [T, in]) plus each adapted token's low-rank update."""
        if self.batch.is_empty:
            return y
        order, offsets = self.batch.groups
        y = y.contiguous()
        self.lora_rows(y, x.contiguous(), self.a, self.b, order, offsets, self.out_offsets, self.rank)
        return y


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
