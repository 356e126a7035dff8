"""A GGUF matrix's per-group scales and offsets as the file keeps them: an fp16 super per block of
the file (its d, dmin) times an int8 factor per group (its 6-bit sc, -m; 1 or -8 where the block is
one group), for 16-column blocks (kernels/gguf_pack.cpp makes them, kernels/gemm_int8_dot.cpp's
compact ops read them):

    S[b, g, j] = float(scale_supers[b, g / R, j]) * float(scale_subs[b, g, j])        R = groups per super
    O[b, g, j] = float(offset_supers or scale_supers [b, g / R, j]) * float(offset_subs[b, g, j])

one fp32 product each, the one gguf's dequantization computes, so the values are exact. 3 bytes per
group and column (Q4_K: 0.08 bytes a weight) where fp32 S and O take 8 (0.25).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zserve.model_proc.layers.block_cat import cat_blocks


@dataclass(frozen=True)
class CompactScales:
    scale_supers: torch.Tensor  # fp16 [NB, NG / R, 16]
    scale_subs: torch.Tensor  # int8 [NB, NG, 16]
    offset_supers: torch.Tensor | None  # fp16 like scale_supers, or None: the offsets' supers are the scales'
    offset_subs: torch.Tensor | None  # int8 like scale_subs, or None: no offsets

    @property
    def ratio(self) -> int:
        """Groups per super (R)."""
        return self.scale_subs.shape[1] // self.scale_supers.shape[1]

    def _expand(self, supers: torch.Tensor, subs: torch.Tensor) -> torch.Tensor:
        return supers.float().repeat_interleave(self.ratio, dim=1) * subs.float()

    def scales(self) -> torch.Tensor:
        """float32 [NB, NG, 16]: S."""
        return self._expand(self.scale_supers, self.scale_subs)

    def offsets(self) -> torch.Tensor | None:
        """float32 [NB, NG, 16]: O, or None."""
        if self.offset_subs is None:
            return None
        supers = self.scale_supers if self.offset_supers is None else self.offset_supers
        return self._expand(supers, self.offset_subs)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        parts = (self.scale_supers, self.scale_subs, self.offset_supers, self.offset_subs)
        return tuple(t for t in parts if t is not None)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def same_form(self, other: CompactScales) -> bool:
        return (self.ratio, self.offset_supers is None, self.offset_subs is None) == (
            other.ratio, other.offset_supers is None, other.offset_subs is None
        )

    @staticmethod
    def cat(parts: Sequence[CompactScales]) -> CompactScales:
        """The parts' blocks one after the other (parts of one form: `same_form`)."""

        def joined(name: str) -> torch.Tensor | None:
            tensors = [getattr(p, name) for p in parts]
            return None if tensors[0] is None else cat_blocks(tensors)

        return CompactScales(*(joined(n) for n in ("scale_supers", "scale_subs", "offset_supers", "offset_subs")))
