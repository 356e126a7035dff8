"""WeightMemory: what the model worker holds for the model, next to what the file stores.

The worker builds it once, after loading (model_proc/resident_memory.py), logs it as one line and
sends it in WorkerReady; the scheduler hands it out with every StatsOut, and GET /server_info shows
it as `memory`. A wire message (nested, no tag). Torch-free.
"""

from __future__ import annotations

import msgspec

from zserve.common.wire import Message

MB = 1e6


def _by_size(bytes_by_key: dict[str, int]) -> str:
    parts = sorted(bytes_by_key.items(), key=lambda item: -item[1])
    return ", ".join(f"{key} {num_bytes / MB:.1f}" for key, num_bytes in parts)


class WeightMemory(Message):
    # the checkpoint's tensors by stored type: a GGUF file's GGML types (Q4_K, Q6_K, F32, ...), safetensors' dtypes
    file_bytes_by_type: dict[str, int] = msgspec.field(default_factory=dict)
    # the worker's copy of the model by form: "4-bit codes", "int8 codes", "fp32 scales, offsets and biases",
    # "<dtype> matrices" (16-bit weights), "<dtype> embeddings and norms" (every other parameter)
    resident_bytes_by_form: dict[str, int] = msgspec.field(default_factory=dict)
    weight_copy_bytes: int = 0  # a second copy of the matrices for products of many rows (--gemm-weight-copy)
    kv_pool_bytes: int = 0

    @property
    def file_bytes(self) -> int:
        return sum(self.file_bytes_by_type.values())

    @property
    def resident_bytes(self) -> int:
        """The model's weights as the worker keeps them, the second copy included."""
        return sum(self.resident_bytes_by_form.values()) + self.weight_copy_bytes

    def summary(self) -> str:
        """One log line, sizes in MB."""
        copy = f"a second copy {self.weight_copy_bytes / MB:.1f}" if self.weight_copy_bytes else "no second copy"
        ratio = f" ({self.resident_bytes / self.file_bytes:.2f}x)" if self.file_bytes else ""
        return (
            f"weights {self.resident_bytes / MB:.1f} MB resident{ratio}: {_by_size(self.resident_bytes_by_form)}; "
            f"{copy}; on file {self.file_bytes / MB:.1f} MB: {_by_size(self.file_bytes_by_type)}; "
            f"KV pool {self.kv_pool_bytes / MB:.1f} MB"
        )

    def as_dict(self) -> dict[str, object]:
        """What /server_info shows: the fields and the two totals."""
        return {**msgspec.structs.asdict(self), "file_bytes": self.file_bytes, "resident_bytes": self.resident_bytes}
