"""A GGUF file's tensors, memory-mapped, from a header checked against the file
(common/gguf_file_check.py): what the GGUF checkpoint reads instead of gguf.GGUFReader, which
parses every metadata array element by element (seconds for a 49k-token vocabulary, more for
128k) although the model worker needs only the tensors and the architecture's name.

Each tensor's `data` is a read-only numpy view of the map, shaped as gguf.GGUFReader shapes it
(F32 / F16: the values, dims outermost first; BF16 and the quantized types: uint8 rows of the
innermost dim's bytes). `release(array)` drops a view's pages from this process's resident set
once its tensor has been packed (the page cache keeps them; a later read maps them again), so
the worker's memory is what it packed, not the file as well.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zserve.common.gguf_file_check import check_gguf_file
from zserve.common.int_math import cdiv

PAGE_BYTES = mmap.PAGESIZE


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor, named and shaped as gguf.ReaderTensor (shape innermost first)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # innermost first, as GGML lists them
    data: np.ndarray  # a view of the map (see the top)
    n_bytes: int


class GGUFFile:
    def __init__(self, gguf_file: str | Path):
        import gguf

        self.path = Path(gguf_file)
        layout = check_gguf_file(self.path)  # a truncated or lying header: one ValueError naming the tensor
        self.strings = layout.strings
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors: list[GGUFTensor] = []
        for info in layout.tensors:
            qtype = gguf.GGMLQuantizationType(info.type_id)
            block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            num_values = int(np.prod(info.dims))
            n_bytes = num_values // block_values * block_bytes
            start = layout.data_start + info.offset
            raw = self._bytes[start : start + n_bytes]
            outer = tuple(reversed(info.dims))  # outermost first
            if qtype == gguf.GGMLQuantizationType.F32:
                data = raw.view(np.float32).reshape(outer)
            elif qtype == gguf.GGMLQuantizationType.F16:
                data = raw.view(np.float16).reshape(outer)
            else:  # BF16 and the quantized types: bytes, the innermost dim as its blocks' bytes
                data = raw.reshape(*outer[:-1], info.dims[0] // block_values * block_bytes)
            self.tensors.append(GGUFTensor(info.name, qtype, tuple(info.dims), data, n_bytes))

    def release(self, data: np.ndarray) -> None:
        """Drop the whole pages under `data` (a view of this file's map) from the resident set."""
        start = data.__array_interface__["data"][0] - self._bytes.__array_interface__["data"][0]
        first = cdiv(start, PAGE_BYTES) * PAGE_BYTES
        last = (start + data.nbytes) // PAGE_BYTES * PAGE_BYTES
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)
