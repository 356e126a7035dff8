"""A 4-bit AWQ safetensors checkpoint (config.json's `quantization_config`, quant_method "awq",
the "gemm" packing with zero points, groups a multiple of 32): each layer's qweight, qzeros and
scales read as an Int4Weight (checkpoints/packed_int4_checkpoint.py) whatever the --quantization;
served as int8 (the 4-bit layers as they came, the float LM head in int8) where `auto` may."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zserve.common.checkpoint_quantization import packed_int4_problem
from zserve.model_proc.checkpoints.checkpoint import Checkpoint
from zserve.model_proc.checkpoints.packed_int4_checkpoint import PackedInt4Scheme
from zserve.model_proc.quant.quant_method import QuantMethod, raw_config


def config_quant_method(raw_config: dict[str, Any]) -> str | None:
    """config.json's `quantization_config.quant_method`, or None."""
    quant = raw_config.get("quantization_config")
    return quant.get("quant_method") if isinstance(quant, dict) else None


@dataclass(frozen=True)
class AwqMethod(QuantMethod):
    name = "awq"
    served = False
    served_as = "int8"

    @classmethod
    def stored_in(cls, model_dir: Path, raw_config: dict[str, Any]) -> bool:
        return config_quant_method(raw_config) == cls.name

    @staticmethod
    def refusal(quant_config: dict[str, Any]) -> str | None:
        # the rule lives in common (torch-free): the launcher refuses such a checkpoint before any worker starts
        return packed_int4_problem(quant_config)

    def open_checkpoint(
        self, model_dir: Path, served: QuantMethod, show_progress: bool, moe_names: Any = None,
        packed_cache: Any = None,
    ) -> Checkpoint:
        scheme = PackedInt4Scheme.from_config(raw_config(model_dir))
        return Checkpoint(model_dir, show_progress=show_progress, packed_int4=scheme)
