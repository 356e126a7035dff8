"""A GGUF file (--model X.gguf; the launcher's directory points at it: common/gguf_source.py).
Served as --quantization gguf, its matrices of every type in weights/gguf_blocks.STORED_TYPES
reach the int8 x int8 kernel as stored: packed from the file's rows by kernels/gguf_pack.cpp
where that op knows the type, decoded to codes, scales and offsets otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.gguf_source import gguf_source
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.checkpoints.gguf_checkpoint import GGUFCheckpoint
from zserve.model_proc.quant.quant_method import QuantMethod
from zserve.model_proc.weights.gguf_blocks import STORED_TYPES


@dataclass(frozen=True)
class GgufMethod(QuantMethod):
    name = "gguf"
    served_as = "gguf"
    gguf_types_kept = frozenset(STORED_TYPES)
    gguf_packs = True
    needs_4bit_and_offsets = True

    @staticmethod
    def stored_in(model_dir: Path, raw_config: dict[str, Any]) -> bool:
        return gguf_source(model_dir) is not None

    def open_checkpoint(
        self, model_dir: Path, served: QuantMethod, show_progress: bool, moe_names: Any = None,
        packed_cache: Any = None,
    ) -> Checkpoint:
        source = gguf_source(model_dir)
        assert source is not None, f"{model_dir} points at no GGUF file"
        return GGUFCheckpoint(model_dir, source, show_progress=show_progress, served=served, moe_names=moe_names,
                              packed_cache=packed_cache)
