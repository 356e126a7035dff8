"""The adapters' matrices of one projection, stacked per adapter: what both forms of the update multiply by
(lora_layer.py's dense products, lora_rows_layer.py's CPU kernel).

For adapter i and a projection y = x @ W (W [in, out], linear.py's layout), PEFT's update is
y += x @ A_i^T @ B_i^T * alpha_i / r_i, with A_i [r_i, in] and B_i [out, r_i] as stored. The stack keeps every
adapter's, transposed, with the scaling folded into B and every adapter padded to the largest rank `r`; a fused
projection's pieces sit side by side in A, and B is block-diagonal (piece p's rank rows feed only its columns):

    a  [num_adapters, in, width]      width >= num_pieces * r (zeros past the pieces)
    b  [num_adapters, width, out]

    adapter i, fused q/k/v:  a[i] = [A_q^T | A_k^T | A_v^T]     b[i] = | B_q^T  0      0     |
                                                                       | 0      B_k^T  0     |
                                                                       | 0      0      B_v^T |

A piece the adapter does not target (or an adapter that targets nothing here) is zeros.
"""

from __future__ import annotations

import torch

Update = tuple[torch.Tensor, torch.Tensor, float]  # (A [r, in], B [out, r], scaling), as PEFT stores them


def stack_updates(pieces: list[list[Update | None]], in_features: int, out_sizes: list[int], rank: int,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) above in float32; `pieces[i][p]`: adapter i's update of piece p of the projection, or None."""
    assert width >= len(out_sizes) * rank, (width, out_sizes, rank)
    a = torch.zeros(len(pieces), in_features, width, dtype=torch.float32)
    b = torch.zeros(len(pieces), width, sum(out_sizes), dtype=torch.float32)
    for i, adapter in enumerate(pieces):
        col = 0
        for p, size in enumerate(out_sizes):
            if adapter[p] is not None:
                lora_a, lora_b, scaling = adapter[p]
                r = lora_a.shape[0]
                assert lora_a.shape == (r, in_features) and lora_b.shape == (size, r), (lora_a.shape, lora_b.shape)
                first = p * rank
                a[i, :, first : first + r] = lora_a.float().T
                b[i, first : first + r, col : col + size] = lora_b.float().T * scaling
            col += size
    return a, b
