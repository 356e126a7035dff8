"""LoraLayer: every loaded adapter's low-rank update of one projection (or of a fused one: q/k/v, gate/up).

For adapter i and a projection y = x @ W (W [in, out], linear.py's layout), PEFT's update is
y += x @ A_i^T @ B_i^T * alpha_i / r_i, with A_i [r_i, in] and B_i [out, r_i] as stored. The layer keeps every
adapter's, transposed, with the scaling folded into B and every adapter padded to the largest rank `r`; a fused
projection's pieces sit side by side in A, and B is block-diagonal (piece p's rank rows feed only its columns):

    a  [in, num_adapters * width]       width = num_pieces * r: adapter 0's columns, then adapter 1's, ...
    b  [num_adapters * width, out]      adapter i's rows, in the same order

    adapter i's block, fused q/k/v:  A_i = [A_q^T | A_k^T | A_v^T]     B_i = | B_q^T  0      0     |
                                                                           | 0      B_k^T  0     |
                                                                           | 0      0      B_v^T |

A step's update is two products for the whole batch, whatever mix of adapters it holds (Punica's grouped
product in its dense form: no gather, no scatter, no loop over requests or adapters):

    shrink   h = (x @ a) * LoraBatch.mask(width)   [T, num_adapters * width]: every token onto every adapter's
                                                   A, keeping only its own adapter's columns (none: base tokens)
    expand   y = y + h @ b                         [T, out]

Where the kernel runs the rows in oneDNN's layout, the mask and the add are the products' post-ops (one call each,
lora_matrix.py); elsewhere a product, then the element-wise op. The shrink is num_adapters * width columns against
the projection's `out`: a few percent of its cost at ranks 8-16; the expand computes every adapter's columns for
every token, most of them masked to zero. The sparse alternative (the step's rows grouped by adapter, one
gather, a shrink and an expand per adapter present on its rows only, an `index_add_` back: SGMV's segments) was
measured slower on the CPU, 1.75x the base decode step against 1.33x (BENCHMARKS.md section 33): products of
these shapes cost by the call and by the output they write, not by their FLOPs, and it triples the calls and
adds a scatter. A piece the adapter does not target (or an adapter that targets nothing here) is zeros. Both
products run on the server's weight kernel in the model's dtype (lora_matrix.py).
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.layers.weight_kernels.weight_kernel import WeightKernel
from zserve.model_proc.lora.lora_batch import LoraBatch
from zserve.model_proc.lora.lora_matrix import LoraMatrix

Update = tuple[torch.Tensor, torch.Tensor, float]  # (A [r, in], B [out, r], scaling), as PEFT stores them


class LoraLayer(nn.Module):
    def __init__(self, shrink: LoraMatrix, expand: LoraMatrix, width: int, batch: LoraBatch):
        super().__init__()
        self.shrink, self.expand = shrink, expand  # a and b above
        self.width = width  # columns of `a` per adapter
        self.batch = batch  # the runner's: which adapter each token of the step belongs to

    @staticmethod
    def build(pieces: list[list[Update | None]], in_features: int, out_sizes: list[int], rank: int,
              batch: LoraBatch, kernel: WeightKernel | None) -> LoraLayer:
        """`pieces[i][p]`: adapter i's update of piece p of the projection, or None; `kernel`: the weight kernel
        the products run on (None: torch's)."""
        width = len(out_sizes) * rank
        a = torch.zeros(in_features, len(pieces) * width, dtype=torch.float32)
        b = torch.zeros(len(pieces) * width, sum(out_sizes), dtype=torch.float32)
        for i, adapter in enumerate(pieces):
            col = 0
            for p, size in enumerate(out_sizes):
                if adapter[p] is not None:
                    lora_a, lora_b, scaling = adapter[p]
                    r = lora_a.shape[0]
                    assert lora_a.shape == (r, in_features) and lora_b.shape == (size, r), (lora_a.shape, lora_b.shape)
                    first = i * width + p * rank
                    a[:, first : first + r] = lora_a.float().T
                    b[first : first + r, col : col + size] = lora_b.float().T * scaling
                col += size
        shrink = LoraMatrix(a.to(batch.device, batch.dtype), kernel)
        expand = LoraMatrix(b.to(batch.device, batch.dtype), kernel)
        return LoraLayer(shrink, expand, width, batch)

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y ([T, out], the base projection of x [T, in]) plus each adapted token's low-rank update."""
        if self.batch.is_empty:
            return y
        h = self.shrink.masked(x, self.batch.mask(self.width))
        # y is the projection's own fresh output (the weight kernels allocate it): added to in place, or replaced
        # by the fused product's sum (lora_matrix.py)
        return self.expand.added_to(y, h)
