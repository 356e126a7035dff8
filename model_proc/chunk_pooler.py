"""The worker's part of pooling (--task embed): one vector per row of a ForwardBatch.

The vectors are taken after the model's final norm (transformers' AutoModel `last_hidden_state`), in
float32, per the batch's pooling mode (common/pooling.py, which draws how the scheduler folds a
prompt's chunks):

    last   the chunk's last position           (the prompt's last chunk gives the embedding)
    cls    the chunk's first position          (kept only from the chunk at position 0)
    mean   the sum over the chunk's positions  (divided by the prompt's length at the end)

A KV-sharing row (an identical prompt admitted in the same step) reads its source's positions, as its
logits do (ForwardBatch.token_starts).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from zserve.common.forward_batch import ForwardBatch


def final_norm(model: nn.Module) -> nn.Module:
    """The model's norm after its last layer (Llama-family `norm`, GPT-2 `ln_f`)."""
    norm = getattr(model, "norm", None) or getattr(model, "ln_f", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__} has no final norm to pool embeddings after")
    return norm


def pool_chunks(norm: nn.Module, hidden: torch.Tensor, batch: ForwardBatch) -> np.ndarray:
    """float32[num_reqs, hidden_size]: each row's vector for this step, per `batch.pooling`.
    `hidden`: every computed token's hidden state before the final norm, row after row."""
    starts = batch.token_starts()
    ends = starts + batch.extend_lens
    if batch.pooling == "mean":
        normed = norm(hidden).float()
        sums = [normed[start:end].sum(dim=0) for start, end in zip(starts.tolist(), ends.tolist(), strict=True)]
        return torch.stack(sums).cpu().numpy()
    if batch.pooling not in ("last", "cls"):
        raise ValueError(f"ForwardBatch {batch.step_id}: unknown pooling {batch.pooling!r}")
    idx = ends - 1 if batch.pooling == "last" else starts
    picked = hidden.index_select(0, torch.from_numpy(idx.astype(np.int64)).to(hidden.device))
    return norm(picked).float().cpu().numpy()
