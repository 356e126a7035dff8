"""Raw-bytes encoding of numpy arrays for msgpack messages (never pickle)."""

from __future__ import annotations

import numpy as np


def pack_array(arr: np.ndarray, dtype: np.dtype | type) -> bytes:
    return np.ascontiguousarray(arr, dtype=dtype).tobytes()


def unpack_array(raw: bytes, dtype: np.dtype | type) -> np.ndarray:
    """Zero-copy, read-only view of `raw`. Copy before mutating."""
    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {np.dtype(dtype).name} items")
    return np.frombuffer(raw, dtype=dtype)
