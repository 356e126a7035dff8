"""LoraBatch: which adapter each token of the step belongs to, as the masks every LoRA layer multiplies by.

The runner owns it: `set_tokens` before each forward, from ForwardBatch.token_lora_ids (None: no adapted token,
and every LoraLayer returns at once: the base path does no extra work). A LoraLayer's shrink product gives each
token its projection onto every loaded adapter's A (lora_layer.py); the mask keeps, in each token's row, only
its own adapter's `width` columns (none for a token of the base model):

    tokens      t0  t1  t2  t3              adapters  1  -1  0  1        (-1: the base model)
    mask(2)     [ 0 0 | 1 1 ]   t0          adapter 0's columns | adapter 1's, `width` = 2 each
                [ 0 0 | 0 0 ]   t1
                [ 1 1 | 0 0 ]   t2
                [ 0 0 | 1 1 ]   t3

Built once per step and width (the fused q/k/v's, gate/up's and a single projection's), shared by every layer.
The CPU kernel's layers (lora_rows_layer.py) read the same step as `groups`: the adapted tokens' rows ordered by
adapter (stable), and where each adapter's run starts:

    adapters  1  -1  0  1       order   [2 | 0 3]       offsets  [0, 1, 3]   (adapter 0: order[0:1], 1: order[1:3])
"""

from __future__ import annotations

import numpy as np
import torch


class LoraBatch:
    def __init__(self, num_adapters: int, dtype: torch.dtype, device: torch.device):
        self.num_adapters = num_adapters
        self.dtype, self.device = dtype, device
        self._one_hot: torch.Tensor | None = None  # [num_tokens, num_adapters]; None: no adapted token this step
        self._masks: dict[int, torch.Tensor] = {}  # width -> [num_tokens, num_adapters * width], this step's
        self._groups: tuple[torch.Tensor, torch.Tensor] | None = None  # (order, offsets), this step's

    @property
    def is_empty(self) -> bool:
        return self._one_hot is None

    def set_tokens(self, token_lora_ids: np.ndarray | None) -> None:
        """The step's tokens' adapters (int32[num_tokens], -1 none), or None when no token has one."""
        self._masks = {}
        self._one_hot = None
        self._groups = None
        if token_lora_ids is None or not (token_lora_ids >= 0).any():
            return
        one_hot = np.zeros((token_lora_ids.size, self.num_adapters), np.float32)
        adapted = np.flatnonzero(token_lora_ids >= 0)
        one_hot[adapted, token_lora_ids[adapted]] = 1.0
        self._one_hot = torch.from_numpy(one_hot).to(device=self.device, dtype=self.dtype)
        adapters = token_lora_ids[adapted]
        order = adapted[np.argsort(adapters, kind="stable")].astype(np.int32)
        offsets = np.zeros(self.num_adapters + 1, np.int32)
        offsets[1:] = np.cumsum(np.bincount(adapters, minlength=self.num_adapters))
        self._groups = (torch.from_numpy(order), torch.from_numpy(offsets))

    @property
    def groups(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(order int32 [adapted tokens]: their rows, adapter 0's first; offsets int32 [num_adapters + 1]: adapter
        i's rows are order[offsets[i]:offsets[i + 1]]), on the CPU; only while not `is_empty`."""
        assert self._groups is not None, "no adapted token this step"
        return self._groups

    def mask(self, width: int) -> torch.Tensor:
        """[num_tokens, num_adapters * width]: 1 in a token's own adapter's `width` columns, else 0."""
        mask = self._masks.get(width)
        if mask is None:
            mask = self._masks[width] = self._one_hot.repeat_interleave(width, dim=1)
        return mask
