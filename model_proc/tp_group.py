"""The tensor-parallel process group of one model worker rank, and the worker's own collectives.

    with tp_group(init_method, rank, world_size, device, timeout_s):
        check_same_on_all_ranks(settings_fingerprint(...), device)  # every node started alike
        ModelRunner(...)         # layers all-reduce / all-gather on the default group;
                                 # the KV pool takes min_across_ranks of what memory allows

The group is torch.distributed's default group: NCCL when the rank's device is CUDA, gloo on CPU.
A one-rank worker never touches torch.distributed. The layers' collectives live in
layers/parallel.py; this file holds only what the worker needs around them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def rank_device(device: str, local_index: int, tp_size: int) -> torch.device:
    """The device of a rank: `auto` resolved; with several ranks on CUDA, cuda:<local index>,
    made current so that "cuda" means this rank's GPU everywhere in the process."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and tp_size > 1:
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available")
        if resolved.index is None:
            resolved = torch.device("cuda", local_index)
        if resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"local rank {local_index} needs cuda:{resolved.index}, "
                f"but {torch.cuda.device_count()} GPUs are visible"
            )
        torch.cuda.set_device(resolved)
    return resolved


@contextmanager
def tp_group(init_method: str, rank: int, world_size: int, device: torch.device, timeout_s: float) -> Iterator[None]:
    """Join the group (blocks until every rank has, up to `timeout_s`); leave it on exit.
    `timeout_s` also bounds each collective: a rank stuck that long fails instead of hanging."""
    if world_size == 1:
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def min_across_ranks(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def check_same_on_all_ranks(fingerprint: int, device: torch.device, what: str) -> None:
    """Raise on every rank if any rank's `fingerprint` differs (a node started with other flags)."""
    t = torch.tensor([fingerprint, -fingerprint], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)  # [min, -max]
    if int(t[0]) != -int(t[1]):
        raise ValueError(
            f"the tensor-parallel ranks were started with different {what}; start every node with the same ones"
        )


def settings_fingerprint(model_dir: str, **settings) -> int:
    """63-bit hash of the model's config.json and the settings every rank must share."""
    digest = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return int.from_bytes(digest.digest()[:8], "little") >> 1
