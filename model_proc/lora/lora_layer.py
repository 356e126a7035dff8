"""LoraLayer: every loaded adapter's low-rank update of one projection (or of a fused one: q/k/v, gate/up).

For adapter i and a projection y = x @ W (W [in, out], linear.py's layout), PEFT's update is
y += x @ A_i^T @ B_i^T * alpha_i / r_i, with A_i [r_i, in] and B_i [out, r_i] as stored. The layer keeps them
stacked over adapters, transposed and with the scaling folded into B, every adapter padded to the largest rank:

    a  [num_adapters, in, num_pieces * rank]     A of each piece of a fused projection, side by side
    b  [num_adapters, num_pieces * rank, out]    B block-diagonal: piece p's rank rows feed only its columns

    fused q/k/v:  a_i = [A_q^T | A_k^T | A_v^T]       b_i = | B_q^T  0      0     |
                                                            | 0      B_k^T  0     |
                                                            | 0      0      B_v^T |

so one x @ a_i @ b_i gives every piece's delta. A piece the adapter does not target (or an adapter that
targets nothing here) is zeros. Padding costs nothing in the result (zero rows and columns).
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.lora.lora_batch import LoraBatch


class LoraLayer(nn.Module):
    def __init__(self, a: torch.Tensor, b: torch.Tensor, batch: LoraBatch):
        super().__init__()
        self.register_buffer("a", a, persistent=False)
        self.register_buffer("b", b, persistent=False)
        self.batch = batch  # the runner's: which tokens each adapter computes this step

    @staticmethod
    def build(
        pieces: list[list[tuple[torch.Tensor, torch.Tensor, float] | None]], in_features: int, out_sizes: list[int],
        rank: int, batch: LoraBatch, dtype: torch.dtype, device: torch.device,
    ) -> LoraLayer:
        """`pieces[i][p]`: adapter i's (A [r, in], B [out_p, r], scaling) for piece p of the projection, or None."""
        num_pieces = len(out_sizes)
        a = torch.zeros(len(pieces), in_features, num_pieces * rank, dtype=torch.float32)
        b = torch.zeros(len(pieces), num_pieces * rank, sum(out_sizes), dtype=torch.float32)
        for i, adapter in enumerate(pieces):
            col = 0
            for p, size in enumerate(out_sizes):
                if adapter[p] is not None:
                    lora_a, lora_b, scaling = adapter[p]
                    r = lora_a.shape[0]
                    assert lora_a.shape == (r, in_features) and lora_b.shape == (size, r), (lora_a.shape, lora_b.shape)
                    a[i, :, p * rank : p * rank + r] = lora_a.float().T
                    b[i, p * rank : p * rank + r, col : col + size] = lora_b.float().T * scaling
                col += size
        return LoraLayer(a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype), batch)

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y ([T, out], the base projection of x [T, in]) plus each adapted token's low-rank update."""
        batch = self.batch
        if batch.is_empty:
            return y
        xs = x.index_select(0, batch.token_idx)  # the adapted tokens, grouped by adapter
        deltas = [xs[start:end] @ self.a[adapter] @ self.b[adapter] for adapter, start, end in batch.segments]
        delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas)
        return y.index_add(0, batch.token_idx, delta.to(y.dtype))
