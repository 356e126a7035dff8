"""The bytes a loaded model holds, by form (common/weight_memory.py's `resident_bytes_by_form`).

Each GemmWeight's packed state (and a MoE layer's stacked experts': layers/stacked_experts.py) counts
once: its codes ("4-bit codes", "6-bit codes", "int8 codes") or 16-bit values ("<dtype> matrices"), its
fp32 scales, offsets and padded bias, and apart from those the second copy a row-split kernel keeps for
products of many rows; an embedding table kept in the file's blocks (VocabParallelEmbedding.packed_table)
counts its codes and scales likewise (once, where a tied LM head multiplies by the same tensors). Every
other parameter or buffer
(embeddings, norms, biases, a torch kernel's plain matrix) counts by dtype, each storage once.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from zserve.model_proc.layers.embedding import VocabParallelEmbedding
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.stacked_experts import StackedExperts

CODE_FORMS = {4: "4-bit codes", 6: "6-bit codes", 8: "int8 codes"}
SIDE_FORM = "fp32 scales, offsets and biases"
COMPACT_FORM = "fp16 x int8 scales and offsets"  # weights/compact_scales.py


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> int:
    """What identifies `t`'s memory: its data pointer (a oneDNN-packed tensor has none: itself)."""
    return id(t) if t.is_mkldnn else t.data_ptr()


def resident_bytes_by_form(model: nn.Module, dtype: torch.dtype) -> tuple[dict[str, int], int]:
    """(bytes by form, bytes of the second copies) of `model` after packing; `dtype` the compute
    dtype, which names unquantized matrices whatever their packed layout's element type."""
    forms: Counter[str] = Counter()
    copy_bytes = 0
    counted: set[int] = set()  # storages already counted (data_ptr)

    def count(form: str, t: torch.Tensor | None) -> None:
        if t is not None and _storage_key(t) not in counted:
            counted.add(_storage_key(t))
            forms[form] += _nbytes(t)

    packed_weights = [m.packed for m in model.modules() if isinstance(m, GemmWeight) and m.packed is not None]
    packed_weights += [p for m in model.modules() if isinstance(m, StackedExperts) for p in m.packed_weights()]
    while packed_weights:
        packed = packed_weights.pop()
        if packed.pieces:  # column pieces, each in its own format (weights/column_pieces.py)
            packed_weights.extend(packed.pieces)
            continue
        count(CODE_FORMS.get(packed.bits, f"{_dtype_name(dtype)} matrices"), packed.values)
        for side in (packed.scales, packed.offsets, packed.bias):
            count(SIDE_FORM, side)
        for side in packed.compact.tensors() if packed.compact is not None else ():
            count(COMPACT_FORM, side)
        if packed.many_rows_values is not None and _storage_key(packed.many_rows_values) not in counted:
            counted.add(_storage_key(packed.many_rows_values))
            copy_bytes += _nbytes(packed.many_rows_values)
    for table in (m.packed_table for m in model.modules() if isinstance(m, VocabParallelEmbedding)):
        if table is not None:  # an untied table is no GemmWeight's: counted here, or not at all
            count(CODE_FORMS[table.bits], table.values)
            for side in table.compact.tensors():
                count(COMPACT_FORM, side)
    for t in (*model.parameters(), *model.buffers()):
        count(f"{_dtype_name(t.dtype)} embeddings and norms", t)
    return dict(forms), copy_bytes
