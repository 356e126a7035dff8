"""The interface of one quantization method: vLLM's QuantizationConfig, on the loading side.

A method answers, for its own weights, the four questions the rest of the model worker asks:

    detected   `stored_in(model_dir, raw_config)`: does this checkpoint store its weights in it
               (a GGUF file, an AWQ / GPTQ `quantization_config`; the online methods never are);
               `refusal(quant_config)`: why a config naming it is not loaded (None: it is)
    auto       `served_as`: the --quantization `--quantization auto` serves such a checkpoint with,
               on a CPU where the int8 x int8 kernel runs in a 16-bit dtype (else "none")
    read       `open_checkpoint(model_dir, served, ...)`: the reader of its files, which
               hands a matrix to the kernel as stored where `served` keeps that type
               (`gguf_types_kept`, `gguf_packs`), as float rows otherwise
    kernels    `runs_on(kernel)`: the kernel's family (`kernel_family`: a WeightKernel.quantization)
               and whether the method needs 4-bit codes and offsets (`needs_4bit_and_offsets`);
               layers/weight_kernels/registry.py asks it, then `set_up` (int4: 4-bit codes)

The methods (quant/methods.py's QUANTIZATION_METHODS): none, int8, int4, gguf (served through
--quantization) and awq, gptq (checkpoint formats, served as int8). Adding one is one class here.
A method is a stateless frozen dataclass; it imports nothing above the checkpoint readers.
"""

from __future__ import annotations

import json
from abc import ABC
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from zserve.model_proc.checkpoints.checkpoint import Checkpoint


def raw_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of `model_dir` as a dict ({} without one)."""
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@dataclass(frozen=True)
class QuantMethod(ABC):
    name: ClassVar[str]  # its key in QUANTIZATION_METHODS (and, for the served ones, the --quantization value)
    quantized: ClassVar[bool] = True  # its weights are quantized (none: they are not)
    served: ClassVar[bool] = True  # a --quantization value (common/weight_formats.py QUANTIZATION_CHOICES)
    kernel_family: ClassVar[str] = "int8"  # the WeightKernel.quantization of the kernels that run it
    needs_4bit_and_offsets: ClassVar[bool] = False  # only kernels with `takes_4bit_and_offsets` run it
    served_as: ClassVar[str] = "none"  # what --quantization auto serves a checkpoint stored in it with
    gguf_types_kept: ClassVar[frozenset[str]] = frozenset()  # GGUF types whose matrices reach the kernel as stored
    gguf_packs: ClassVar[bool] = False  # those packed from the file into the int8 x int8 layout, not decoded

    @staticmethod
    def stored_in(model_dir: Path, raw_config: dict[str, Any]) -> bool:
        """Whether the checkpoint in `model_dir` (config.json's dict `raw_config`) stores its weights in this method."""
        return False

    @staticmethod
    def refusal(quant_config: dict[str, Any]) -> str | None:
        """Why a `quantization_config` naming this method is not loaded, or None when it is."""
        return None

    def runs_on(self, kernel: Any) -> bool:
        """Whether `kernel` (a WeightKernel) runs this method's weights."""
        if kernel.quantization != self.kernel_family:
            return False
        return kernel.takes_4bit_and_offsets or not self.needs_4bit_and_offsets

    def set_up(self, kernel: Any) -> Any:
        """`kernel` (one that `runs_on` accepted) set up for this method's weights."""
        return kernel

    def open_checkpoint(
        self, model_dir: Path, served: QuantMethod, show_progress: bool, moe_names: Any = None,
        packed_cache: Any = None,
    ) -> Checkpoint:
        """The reader of a checkpoint stored in this method, served as `served` (`moe_names`: the
        model's MoE naming, layers/sparse_moe.py MoeNames, for a file that stores experts stacked;
        `packed_cache`: checkpoints/packed_cache.py's PackedCache where the reader packs at load, or None)."""
        return Checkpoint(model_dir, show_progress=show_progress)
