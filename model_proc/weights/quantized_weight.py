"""A weight the checkpoint stored quantized, on its way from the reader to the kernel.

A reader's `read_weight` returns either float rows or such a weight (GGUF Q8_0: an Int8Weight,
weights/int8_weights.py); nothing rides on the tensors or parameters. A format is a frozen
dataclass whose tensors all have the output columns last ([*, out]: a [in, out] weight's
orientation), with `out_features` and `dequantize()`; the pieces of a fused weight (q, k, v)
then join side by side (`join_columns`), and the layer packs the joined weight when every output
column came so, its float values otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Protocol

import torch

from zserve.model_proc.weights.column_pieces import ColumnPieces
from zserve.model_proc.weights.int4_weights import common_format
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks, join_blocks


class QuantizedWeight(Protocol):
    @property
    def in_features(self) -> int: ...

    @property
    def out_features(self) -> int: ...

    def dequantize(self) -> torch.Tensor:
        """float32 [in, out]: the values it stands for."""
        ...


def split_loaded(loaded: torch.Tensor | QuantizedWeight) -> tuple[torch.Tensor, QuantizedWeight | None]:
    """A `read_weight` result as (its float [out, in] rows, the stored quantized weight or None)."""
    if isinstance(loaded, torch.Tensor):
        return loaded, None
    return loaded.dequantize().t(), loaded


def on_device(weight: QuantizedWeight, device: torch.device) -> QuantizedWeight:
    """`weight` with its tensors on `device` (itself where they are)."""
    moved = {
        f.name: value.to(device)
        for f in fields(weight)
        if isinstance(value := getattr(weight, f.name), torch.Tensor) and value.device != device
    }
    return replace(weight, **moved) if moved else weight


def unpacked_join(stored: QuantizedWeight) -> QuantizedWeight | None:
    """A weight in the int8 x int8 GEMM's layout (PackedBlocks, ColumnPieces) as codes [K, N] (Int4Weight,
    Int8Weight), for another kernel: the same values; None where its pieces join into no one format."""
    if isinstance(stored, PackedBlocks):
        return stored.unpacked()
    if isinstance(stored, ColumnPieces):
        offsets = stored.column_offsets()
        return join_columns([(col, part.unpacked()) for col, part in zip(offsets, stored.parts, strict=True)],
                            stored.out_features)
    return stored


def join_columns(parts: Sequence[tuple[int, QuantizedWeight]], out_features: int) -> QuantizedWeight | None:
    """The [in, out_features] weight made of (column offset, piece) pieces side by side, or None
    unless they cover every column, in order, in one format with the same settings (group size)."""
    if not parts:
        return None
    packed = join_blocks(parts, out_features)  # pieces already in the GEMM's layout: blocks side by side
    if packed is None:
        packed = ColumnPieces.of(parts, out_features)  # in the GEMM's layout, of two types: each kept in its own
    if packed is not None:
        return packed
    parts = [(col, part.unpacked() if isinstance(part, PackedBlocks) else part) for col, part in parts]
    common = common_format([part for _, part in parts])
    if common is not None:
        parts = [(col, part) for (col, _), part in zip(parts, common, strict=True)]
    first = parts[0][1]
    tensor_names = [f.name for f in fields(first) if isinstance(getattr(first, f.name), torch.Tensor)]
    # a tensor field set in one piece and None in another (offsets) differs in format: compared below
    settings = [f.name for f in fields(first) if f.name not in tensor_names]
    next_col = 0
    for col, part in parts:
        same_format = (
            type(part) is type(first)
            and all(getattr(part, s) == getattr(first, s) for s in settings)
            and all(isinstance(getattr(part, t), torch.Tensor) for t in tensor_names)
        )
        if col != next_col or not same_format:
            return None
        next_col += part.out_features
    if next_col != out_features:
        return None
    joined = {name: torch.cat([getattr(part, name) for _, part in parts], dim=1) for name in tensor_names}
    return replace(first, **joined)
