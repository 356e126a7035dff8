"""LoraBatch: which tokens of the step each LoRA adapter computes, grouped once per step for every layer.

Punica's idea, on the CPU: the step's tokens are sorted by adapter once (`token_idx`, the adapted tokens in
adapter order; the base model's are left out), so each adapted projection of each layer gathers its input
rows in one index_select, runs one pair of small matmuls per adapter present (never one per request), and
adds the deltas back in one index_add:

    tokens       t0 t1 t2 t3 t4 t5        adapters  1 -1 0 1 -1 0       (-1: the base model)
    token_idx    [ t2 t5 | t0 t3 ]        segments  (0, 0, 2) (1, 2, 4)

The runner owns it: `set_tokens` before each forward, from ForwardBatch.token_lora_ids (None: no adapted
token, and every LoraLayer returns at once: the base path does no extra work).
"""

from __future__ import annotations

import numpy as np
import torch


class LoraBatch:
    def __init__(self, device: torch.device):
        self.device = device
        self.token_idx: torch.Tensor | None = None  # int64[num_adapted]: adapted tokens, grouped by adapter
        self.segments: list[tuple[int, int, int]] = []  # (adapter, start, end) into token_idx

    @property
    def is_empty(self) -> bool:
        return not self.segments

    def set_tokens(self, token_lora_ids: np.ndarray | None) -> None:
        """The step's tokens' adapters (int32[num_tokens], -1 none), or None when no token has one."""
        self.segments = []
        self.token_idx = None
        if token_lora_ids is None:
            return
        adapted = np.flatnonzero(token_lora_ids >= 0)
        if adapted.size == 0:
            return
        order = adapted[np.argsort(token_lora_ids[adapted], kind="stable")]
        ids = token_lora_ids[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], ids.size]
        self.segments = [(int(ids[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True)]
        self.token_idx = torch.from_numpy(order.astype(np.int64)).to(self.device)
