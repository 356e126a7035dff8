"""Vocab-parallel token embedding and LM head: rank r holds vocab entries [r * s, (r + 1) * s),
s = ceil(vocab / tp), the last rank's tail zero-padded.

The LM head loads [dim, vocab] and applies as h @ W (gemm.py: packed for the weight kernel); it is
the largest matrix of a small model. A tied embedding shares that tensor, so its lookup gathers
columns instead of rows: T columns per step, cheap next to the LM head's full pass. Packing gives
a tied head its own copy; the embedding keeps the plain tensor (and, until the head takes it, the
weight as a checkpoint stored it quantized: GGUF Q8_0 with --quantization int8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.layers.gemm import GemmWeight
from zserve.model_proc.layers.parallel import all_gather_last_dim, all_reduce, padded_shard_range
from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks
from zserve.model_proc.weights.quantized_weight import (
    QuantizedWeight,
    join_columns,
    split_loaded,
)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, dim: int, tp_rank: int = 0, tp_size: int = 1, transposed: bool = False):
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.tp_size, self.transposed = tp_size, transposed
        self.vocab_start, self.vocab_stop, shard_size = padded_shard_range(vocab_size, tp_rank, tp_size)
        shape = (dim, shard_size) if transposed else (shard_size, dim)
        self.weight = nn.Parameter(torch.empty(shape), requires_grad=False)
        self.dtype = self.weight.dtype
        self.stored: QuantizedWeight | None = None  # tied: the [dim, n] weight as stored quantized, for the LM head
        # a GGUF table kept in the file's blocks (its columns are the vocab entries): rows decoded at lookup, no
        # float copy; a tied LM head multiplies by the same codes
        self.packed_table: PackedBlocks | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(ids)  # [T] -> [T, dim]
        # ids owned by other ranks look up entry 0 here and are zeroed; the all-reduce fills them in
        owned = (ids >= self.vocab_start) & (ids < self.vocab_stop)
        out = self._lookup(torch.where(owned, ids - self.vocab_start, 0)) * owned.unsqueeze(-1).to(self.dtype)
        return all_reduce(out, self.tp_size)

    def _lookup(self, local_ids: torch.Tensor) -> torch.Tensor:
        if self.packed_table is not None:
            return self.packed_table.columns(local_ids).to(self.dtype)  # [T] -> [T, dim]
        if self.transposed:
            return self.weight.index_select(1, local_ids).t().contiguous()  # [dim, T] -> [T, dim]
        return F.embedding(local_ids, self.weight)

    def load(self, ckpt: Checkpoint, name: str) -> None:
        shape, rows = (self.vocab_size, self.dim), (self.vocab_start, self.vocab_stop)
        # a table the file stores in blocks the CPU kernels read stays so when this rank's shard has no padding
        keep_packed = self.vocab_stop - self.vocab_start == self.weight.shape[1 if self.transposed else 0]
        keep_packed = keep_packed and self.weight.device.type == "cpu"
        loaded = ckpt.read_weight(name, shape, rows=rows) if self.transposed or keep_packed else ckpt.read(
            name, shape, rows=rows
        )
        if keep_packed and isinstance(loaded, PackedBlocks):
            ckpt.mark_loaded(self.weight)
            self.weight, self.packed_table = None, loaded
            self.stored = loaded if self.transposed else None  # a tied LM head packs the same codes
            return
        rows_t, stored = split_loaded(loaded)  # [n, dim] floats (a stored weight's exact values)
        if self.transposed:  # tied: the LM head packs this tensor, as stored where it came quantized
            self.stored = stored
        with torch.no_grad():
            (self.weight.t() if self.transposed else self.weight)[rows_t.shape[0] :].zero_()  # padding past the vocab
        ckpt.copy_into(self.weight, rows_t, name, transposed=self.transposed)

    def take_stored(self) -> QuantizedWeight | None:
        """The weight as stored quantized, handed over once (to the tied LM head, which packs it; a
        packed table stays here too, shared)."""
        stored, self.stored = self.stored, None
        return stored


class ParallelLMHead(GemmWeight):
    """logits = h @ W over the full vocab; `tied_to` shares a transposed embedding's weight."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        tied_to: VocabParallelEmbedding | None = None,
    ):
        super().__init__()
        assert tied_to is None or tied_to.transposed, "a tied embedding must be stored [dim, vocab]"
        self.vocab_size, self.dim, self.tp_size = vocab_size, dim, tp_size
        self.vocab_start, self.vocab_stop, shard_size = padded_shard_range(vocab_size, tp_rank, tp_size)
        self.tied_to, self.shard_size = tied_to, shard_size
        self.init_weight(dim, shard_size)
        if tied_to is not None:
            self.weight = None

    def plain_weight(self) -> torch.Tensor:
        if self.tied_to is None:
            return super().plain_weight()
        assert self.tied_to.weight is not None, "the tied embedding keeps no float table"
        return self.tied_to.weight

    def stored_weight(self) -> QuantizedWeight | None:
        if self.tied_to is None:
            return super().stored_weight()
        stored = self.tied_to.take_stored()
        return join_columns([(0, stored)] if stored is not None else [], self.shard_size)

    def pack(self, kernel: WeightKernel, free_plain: bool = True) -> None:
        # a tied embedding still looks tokens up in its tensor
        super().pack(kernel, free_plain=free_plain and self.tied_to is None)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.matmul(h, None)  # [n, dim] @ [dim, vocab / tp]
        if self.tp_size > 1:
            logits = all_gather_last_dim(logits, self.tp_size)[:, : self.vocab_size]
        return logits.float()  # [n, vocab]

    def load(self, ckpt: Checkpoint, name: str) -> None:
        if self.tied_to is not None:
            return
        loaded = ckpt.read_weight(name, (self.vocab_size, self.dim), rows=(self.vocab_start, self.vocab_stop))
        with torch.no_grad():
            self.weight[:, self.vocab_stop - self.vocab_start :].zero_()  # padding past the vocab
        self.fill_weight(ckpt, loaded, name)
        self.loaded()
