"""cat_blocks: tensors joined along their first dimension, as a view when they already lie back to back.

The packed cache (model_proc/checkpoints/packed_cache.py) reads a model's packed matrices into one buffer, the
pieces of a fused matrix (q, k, v; gate, up) one after the other: joining them needs no copy (a
copy into fresh memory costs its page faults: as long as reading the file). Anything else is
torch.cat's copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def cat_blocks(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.cat(tensors) (dim 0): a view of their shared storage when they are contiguous, of one
    dtype and trailing shape, and each starts where the previous one ends in the same storage."""
    first = tensors[0]
    adjacent = all(t.is_contiguous() for t in tensors) and all(
        t.dtype == first.dtype and t.shape[1:] == first.shape[1:]
        and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for t in tensors
    )
    if adjacent:
        for before, after in zip(tensors[:-1], tensors[1:], strict=True):
            if after.data_ptr() != before.data_ptr() + before.numel() * before.element_size():
                adjacent = False
                break
    if not adjacent or first.numel() == 0:
        return torch.cat(list(tensors))
    num_rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((num_rows, *first.shape[1:]), first.stride(), first.storage_offset())
