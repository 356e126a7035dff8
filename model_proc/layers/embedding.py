"""Vocab-parallel token embedding and LM head: rank r holds vocab rows [r * s, (r + 1) * s),
s = ceil(vocab / tp), the last rank's tail zero-padded."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model_proc.checkpoint import Checkpoint
from model_proc.layers.parallel import all_gather_last_dim, all_reduce, padded_shard_range


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.tp_size = tp_size
        self.vocab_start, self.vocab_stop, shard_size = padded_shard_range(vocab_size, tp_rank, tp_size)
        self.weight = nn.Parameter(torch.empty(shard_size, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)  # [T] -> [T, dim]
        # ids owned by other ranks look up row 0 here and are zeroed; the all-reduce fills them in
        owned = (ids >= self.vocab_start) & (ids < self.vocab_stop)
        local_ids = torch.where(owned, ids - self.vocab_start, 0)
        out = F.embedding(local_ids, self.weight) * owned.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out, self.tp_size)

    def load(self, ckpt: Checkpoint, name: str) -> None:
        rows = ckpt.read(name, (self.vocab_size, self.dim), rows=(self.vocab_start, self.vocab_stop))
        with torch.no_grad():
            self.weight[rows.shape[0] :].zero_()
        ckpt.copy_into(self.weight, rows, name)


class ParallelLMHead(nn.Module):
    """logits = h @ W.T over the full vocab; `tied_to` shares the embedding's weight (same shard)."""

    def __init__(self, vocab_size: int, dim: int, tp_rank: int = 0, tp_size: int = 1, tied_to: VocabParallelEmbedding | None = None):
        super().__init__()
        self.vocab_size, self.dim, self.tp_size = vocab_size, dim, tp_size
        self.vocab_start, self.vocab_stop, shard_size = padded_shard_range(vocab_size, tp_rank, tp_size)
        self.tied_to = tied_to
        self.weight = None if tied_to is not None else nn.Parameter(torch.empty(shard_size, dim), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        logits = F.linear(h, weight)  # [n, dim] -> [n, vocab / tp]
        if self.tp_size > 1:
            logits = all_gather_last_dim(logits, self.tp_size)[:, : self.vocab_size]
        return logits.float()  # [n, vocab]

    def load(self, ckpt: Checkpoint, name: str) -> None:
        if self.tied_to is not None:
            return
        rows = ckpt.read(name, (self.vocab_size, self.dim), rows=(self.vocab_start, self.vocab_stop))
        with torch.no_grad():
            self.weight[rows.shape[0] :].zero_()
        ckpt.copy_into(self.weight, rows, name)
