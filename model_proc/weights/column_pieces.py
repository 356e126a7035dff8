"""A fused weight (q | k | v) whose pieces a GGUF file stores in different types, each kept in its own
(llama-quantize's Q4_K_M gives some layers' v a Q6_K beside a Q4_K q and k): joined into one format
they would all become int8 codes with fp32 scales and offsets per 16 inputs (1.5 bytes a weight, where
the pieces take 0.58 and 1.07). The int8 x int8 kernel runs one product per piece into its columns
(weight_kernels/int8_kernels.py); any other kernel gets `unpacked()`, the exact join of their codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zserve.model_proc.weights.column_blocks import BLOCK_COLS
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks


@dataclass(frozen=True)
class ColumnPieces:
    parts: tuple[PackedBlocks, ...]  # side by side, in column order; each but the last whole 16-column blocks

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def out_features(self) -> int:
        return sum(part.out_features for part in self.parts)

    def dequantize(self) -> torch.Tensor:
        """float32 [K, N]: the pieces' values side by side."""
        return torch.cat([part.dequantize() for part in self.parts], dim=1)

    def column_offsets(self) -> list[int]:
        offsets, col = [], 0
        for part in self.parts:
            offsets.append(col)
            col += part.out_features
        return offsets

    @staticmethod
    def of(parts: Sequence[tuple[int, object]], out_features: int) -> ColumnPieces | None:
        """The pieces kept apart, when they are all PackedBlocks of one K, in order, covering every
        column, each but the last whole blocks; else None."""
        if len(parts) < 2 or not all(isinstance(part, PackedBlocks) for _, part in parts):
            return None
        next_col = 0
        for i, (col, part) in enumerate(parts):
            whole = part.out_features % BLOCK_COLS == 0 or i == len(parts) - 1
            if col != next_col or part.in_features != parts[0][1].in_features or not whole:
                return None
            next_col += part.out_features
        return ColumnPieces(tuple(part for _, part in parts)) if next_col == out_features else None
