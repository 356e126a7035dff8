"""LoraLayer: every loaded adapter's low-rank update of one projection (or of a fused one: q/k/v, gate/up), as
dense products: the form for a device without zserve's CPU kernel (lora_rows_layer.py is the CPU's). The adapters'
matrices (lora_stack.py's a [n, in, width] and b [n, width, out], width = num_pieces * r) lie side by side:

    a  [in, num_adapters * width]       adapter 0's columns, then adapter 1's, ...
    b  [num_adapters * width, out]      adapter i's rows, in the same order

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
from zserve.model_proc.lora.lora_stack import Update, stack_updates


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
        stacked_a, stacked_b = stack_updates(pieces, in_features, out_sizes, rank, width)
        a = stacked_a.permute(1, 0, 2).reshape(in_features, len(pieces) * width)
        b = stacked_b.reshape(len(pieces) * width, sum(out_sizes))
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
