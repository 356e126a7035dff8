"""A GGUF matrix's per-group scales and offsets as the file keeps them: an fp16 super per block of
the file (its d, dmin) times an int8 factor per group (its 6-bit sc, -m), for 16-column blocks
(kernels/gguf_pack.cpp makes them, kernels/gemm_int8_dot.cpp's compact ops read them):

    S[b, g, j] = float(scale_supers[b, g / R, j]) * float(scale_subs[b, g, j])        R = groups per super
    O[b, g, j] = float(offset_supers or scale_supers [b, g / R, j]) * float(offset_subs[b, g, j])

one fp32 product each, the one gguf's dequantization computes, so the values are exact. A block that
is one group (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) has no subs: its scale factor is 1 (S = the super) and its
offset factor the type's `implied_offset` (Q4_0: O = d * -8; Q4_1, Q5_1: O = m * 1), kept by no byte,
so those types take their file's bytes. Q4_K: 3 bytes per group and column (0.08 bytes a weight)
where fp32 S and O take 8 (0.25).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zserve.model_proc.weights.block_cat import cat_blocks


@dataclass(frozen=True)
class CompactScales:
    scale_supers: torch.Tensor  # fp16 [NB, NG / R, 16]
    scale_subs: torch.Tensor | None  # int8 [NB, NG, 16], or None: a factor 1 per group (R = 1)
    offset_supers: torch.Tensor | None  # fp16 like scale_supers, or None: the offsets' supers are the scales'
    offset_subs: torch.Tensor | None  # int8 [NB, NG, 16], or None: the implied factor (no offsets where it is 0)
    implied_offset: int = 0  # offset_subs None: O = offset super * implied_offset

    def __post_init__(self) -> None:
        assert self.offset_subs is None or self.implied_offset == 0, "an offset factor is stored or implied, not both"
        assert self.offset_supers is None or self.offset_subs is not None or self.implied_offset != 0

    @property
    def ratio(self) -> int:
        """Groups per super (R)."""
        return 1 if self.scale_subs is None else self.scale_subs.shape[1] // self.scale_supers.shape[1]

    def _expand(self, supers: torch.Tensor, subs: torch.Tensor | None, factor: int = 1) -> torch.Tensor:
        wide = supers.float().repeat_interleave(self.ratio, dim=1)
        return wide * (subs.float() if subs is not None else float(factor))  # super * 1.0 is the super

    def scales(self) -> torch.Tensor:
        """float32 [NB, NG, 16]: S."""
        return self._expand(self.scale_supers, self.scale_subs)

    def offsets(self) -> torch.Tensor | None:
        """float32 [NB, NG, 16]: O, or None."""
        if self.offset_subs is None and self.implied_offset == 0:
            return None
        supers = self.scale_supers if self.offset_supers is None else self.offset_supers
        return self._expand(supers, self.offset_subs, self.implied_offset)

    def picked(self, blocks: torch.Tensor, cols: torch.Tensor) -> CompactScales:
        """Columns (blocks[t], cols[t]) of their blocks, each a block of one column: [T, NG / R or NG, 1]."""
        parts = (self.scale_supers, self.scale_subs, self.offset_supers, self.offset_subs)
        picked = (None if t is None else t[blocks, :, cols].unsqueeze(2) for t in parts)
        return CompactScales(*picked, self.implied_offset)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        parts = (self.scale_supers, self.scale_subs, self.offset_supers, self.offset_subs)
        return tuple(t for t in parts if t is not None)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def same_form(self, other: CompactScales) -> bool:
        def form(c: CompactScales) -> tuple:
            return c.ratio, c.scale_subs is None, c.offset_supers is None, c.offset_subs is None, c.implied_offset

        return form(self) == form(other)

    @staticmethod
    def cat(parts: Sequence[CompactScales]) -> CompactScales:
        """The parts' blocks one after the other (parts of one form: `same_form`)."""

        def joined(name: str) -> torch.Tensor | None:
            tensors = [getattr(p, name) for p in parts]
            return None if tensors[0] is None else cat_blocks(tensors)

        names = ("scale_supers", "scale_subs", "offset_supers", "offset_subs")
        return CompactScales(*(joined(n) for n in names), parts[0].implied_offset)
