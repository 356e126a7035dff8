"""A GGUF matrix's quantized blocks as codes, scales and offsets: what every block decoder
(gguf_small_blocks.py, gguf_super_blocks.py) returns, and the bit reads they share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DecodedBlocks:
    """A matrix [rows, cols] as codes C, scales S and offsets O (None: 0) per `group_size`
    columns: W = C * S + O. `bits` 4: C uint8 in [0, 15]; 8: C int8."""

    codes: torch.Tensor  # [rows, cols]
    scales: torch.Tensor  # float32 [rows, cols / G]
    offsets: torch.Tensor | None
    group_size: int
    bits: int


def grouped(
    codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, group_size: int, bits: int
) -> DecodedBlocks:
    """DecodedBlocks of numpy arrays shaped [rows, ...]: codes flattened to [rows, cols], scales
    and offsets to [rows, cols / group_size]; codes cast to uint8 (4 bits) or int8 (8 bits)."""
    rows = codes.shape[0]
    code_dtype = np.uint8 if bits == 4 else np.int8

    def per_row(values: np.ndarray, dtype: type) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values.reshape(rows, -1).astype(dtype, copy=False)))

    scales_t = per_row(scales, np.float32)
    offsets_t = None if offsets is None else per_row(offsets, np.float32)
    return DecodedBlocks(per_row(codes, code_dtype), scales_t, offsets_t, group_size, bits)


def f16(raw: np.ndarray) -> np.ndarray:
    """float32 of the fp16 values in the last axis's byte pairs."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def bit_planes(packed: np.ndarray, run: int, bits: int) -> np.ndarray:
    """[..., chunks * run] bytes -> [..., chunks * (8 / bits) * run] fields of `bits` bits: each
    chunk of `run` bytes gives its lowest fields, then the next ones up (ggml's order)."""
    lead = packed.shape[:-1]
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(-1, 1)
    fields = packed.reshape(*lead, -1, 1, run) >> shifts
    return (fields & np.uint8((1 << bits) - 1)).reshape(*lead, -1)
