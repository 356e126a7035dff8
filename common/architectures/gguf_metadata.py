"""A GGUF file's metadata as the architecture specs read it (the launcher reads the file once, with gguf)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GgufMetadata:
    architecture: str  # general.architecture
    fields: dict[str, Any]  # metadata key -> its contents
    tensor_shapes: dict[str, tuple[int, ...]]  # tensor name -> shape (GGML order: innermost first)
    rope_factors: dict[str, list[float]]  # rope_factors_*.weight tensors (Phi-3's longrope), read as values
    where: str  # the file's name, for errors

    def get(self, key: str, default: Any = None) -> Any:
        """`<architecture>.<key>` (None or `default` when absent)."""
        value = self.fields.get(f"{self.architecture}.{key}")
        return default if value is None else value

    def int_field(self, key: str) -> int:
        """`<architecture>.<key>` as an int; 0 when absent."""
        return int(self.get(key, 0))

    @property
    def has_output(self) -> bool:
        """An output.weight tensor (none: the LM head is tied to the embedding)."""
        return "output.weight" in self.tensor_shapes
