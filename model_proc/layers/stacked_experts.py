"""A MoE layer's routed experts as one packed weight per projection, run by one op per step.

A GGUF file stacks each projection of a layer's experts in one tensor ([n_expert, out, in]:
blk.N.ffn_{gate,up,down}_exps). With --quantization gguf on the CPU kernels, the checkpoint packs
each such tensor in one gguf_pack call (GGUFCheckpoint.packed_experts): every expert's column
blocks one after the other, the codes and the file's compact scales as any other GGUF matrix keeps
them (packed_blocks_weight.py). Here gate and up are joined per expert, so expert e's [H, 2I]
gate_up weight and its [I, H] down weight are block ranges of two PackedWeights:

    gate_up  codes [E * 2I / 16, H / 8 or H / 4, 16, 4]   expert e: blocks e * 2I / 16 ..
    down     codes [E * H / 16, I / 8 or I / 4, 16, 4]    expert e: blocks e * H / 16 ..

and `forward` is kernels/moe_experts.cpp's zserve::moe_experts: fused_experts.py's loop (its
result bit for bit) in C++, one call per layer instead of a Python module call per expert hit.
18432 expert matrices of a 30B-A3B file become 96 stacked weights: 144 gguf_pack calls at load,
not 18432, and no module, Parameter or packed state per expert.
"""

from __future__ import annotations

import torch
from torch import nn

from zserve.model_proc.layers.weight_kernels.weight_kernel import PackedWeight
from zserve.model_proc.weights.column_blocks import BLOCK_COLS
from zserve.model_proc.weights.compact_scales import CompactScales
from zserve.model_proc.weights.packed_blocks_weight import PackedBlocks

COMPACT_PARTS = ("scale_supers", "scale_subs", "offset_supers", "offset_subs")


def join_per_expert(gate: PackedBlocks, up: PackedBlocks, num_experts: int) -> PackedBlocks | None:
    """Gate's and up's stacked blocks as one gate_up weight per expert (gate's columns, then up's),
    or None when the two differ in form."""
    same = (gate.bits, gate.group_size, gate.in_features) == (up.bits, up.group_size, up.in_features)
    if not same or not gate.compact.same_form(up.compact) or gate.out_features != up.out_features:
        return None

    def join(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
        if a is None:
            return None
        per_expert = (num_experts, a.shape[0] // num_experts, *a.shape[1:])
        return torch.cat([a.view(per_expert), b.view(per_expert)], dim=1).view(-1, *a.shape[1:])

    joined = (join(getattr(gate.compact, n), getattr(up.compact, n)) for n in COMPACT_PARTS)
    compact = CompactScales(*joined, gate.compact.implied_offset)
    return PackedBlocks(join(gate.values, up.values), compact, gate.bits, gate.group_size, gate.in_features,
                        2 * gate.out_features)


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, gate_up: PackedBlocks, down: PackedBlocks):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up = self._packed(gate_up)
        self.down = self._packed(down)
        for prefix, packed in (("gate_up", self.gate_up), ("down", self.down)):  # the model's buffers hold them
            self.register_buffer(f"{prefix}_codes", packed.values, persistent=False)
            for name in COMPACT_PARTS:
                self.register_buffer(f"{prefix}_{name}", getattr(packed.compact, name), persistent=False)
        self._gate_up_parts = self._parts(self.gate_up)
        self._down_parts = self._parts(self.down)

    def _packed(self, stacked: PackedBlocks) -> PackedWeight:
        """Every expert's weight, stacked (out_features: one expert's columns)."""
        per_expert = stacked.out_features // self.num_experts
        if stacked.out_features % self.num_experts or per_expert % BLOCK_COLS:
            raise ValueError(f"{stacked.out_features} stacked columns are not {self.num_experts} experts of whole "
                             f"{BLOCK_COLS}-column blocks")
        return PackedWeight(stacked.values, per_expert, group_size=stacked.group_size, bits=stacked.bits,
                            compact=stacked.compact)

    @staticmethod
    def _parts(packed: PackedWeight) -> list[torch.Tensor]:
        """The op's [codes, scale_supers, scale_subs, offset_supers, offset_subs] (an absent part: empty)."""
        empty = torch.empty(0, dtype=torch.uint8)
        c = packed.compact
        return [packed.values, *(empty if t is None else t for t in (getattr(c, n) for n in COMPACT_PARTS))]

    def packed_weights(self) -> tuple[PackedWeight, PackedWeight]:
        """What resident_memory.py counts: the stacked gate_up and down."""
        return self.gate_up, self.down

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; expert_ids int64 [T, k]; weights [T, k] -> [T, hidden] (fused_experts.py's arithmetic)."""
        return torch.ops.zserve.moe_experts(
            x.contiguous(), expert_ids, weights, self._gate_up_parts, self.gate_up.bits, self.gate_up.group_size,
            self._down_parts, self.down.bits, self.down.group_size, self.num_experts,
            self.gate_up.compact.implied_offset, self.down.compact.implied_offset,
        )
