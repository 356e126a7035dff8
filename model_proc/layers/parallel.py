"""Tensor-parallel helpers: how a dimension is split across ranks, and the two collectives.

Collectives go through torch.distributed (gloo on CPU, NCCL on GPU) and only when tp_size > 1,
so a single-rank worker never touches torch.distributed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zserve.common.int_math import cdiv


def shard_range(full_size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """[start, stop) of rank `tp_rank`'s equal share of `full_size`; it must divide evenly."""
    if full_size % tp_size:
        raise ValueError(f"size {full_size} does not split evenly across {tp_size} tensor-parallel ranks")
    size = full_size // tp_size
    return tp_rank * size, (tp_rank + 1) * size


def padded_shard_range(full_size: int, tp_rank: int, tp_size: int) -> tuple[int, int, int]:
    """(start, stop, shard_size) where every rank holds `shard_size = ceil(full/tp)` rows and the
    last rank's tail past `full_size` is padding (vocab sizes such as GPT-2's 50257 are odd)."""
    shard_size = cdiv(full_size, tp_size)
    start = min(tp_rank * shard_size, full_size)
    return start, min(start + shard_size, full_size), shard_size


def all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    if tp_size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """[..., n] per rank -> [..., n * tp_size], rank order."""
    if tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
