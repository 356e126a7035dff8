"""One model worker rank's place among the tensor-parallel ranks: the device it runs on, its rank
and how many ranks split the model. The ModelRunner builds its share of the model and of the KV
pool by it (a ServerConfig's ParallelSection is the whole layout; this is one rank of it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankPlace:
    device: str = "auto"  # --device as given (auto, cpu, cuda, cuda:1): the runner resolves it
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in 0..{self.tp_size - 1} for tp_size {self.tp_size}, got {self.tp_rank}")
