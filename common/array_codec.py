"""Raw-bytes encoding of 1-D numpy arrays for msgpack messages (never pickle). The one array
codec: wire fields declared `Int32Array` etc. (common/wire.py) go through these two, once per
array per message, so they are kept to one numpy call each (positional arguments: numpy parses
keywords noticeably slower)."""

from __future__ import annotations

from typing import Any

import numpy as np


def pack_array(arr: Any, dtype: np.dtype) -> bytes:
    """`arr` (an array, or a list of numbers) as raw bytes of `dtype`; flattened."""
    return np.ascontiguousarray(arr, dtype).tobytes()


def unpack_array(raw: bytes, dtype: np.dtype) -> np.ndarray:
    """Zero-copy, read-only view of `raw`. Copy before mutating."""
    if type(raw) is not bytes:
        raise TypeError(f"expected {np.dtype(dtype).name} bytes, got {type(raw).__name__}")
    try:
        return np.frombuffer(raw, dtype)
    except ValueError:  # the length is not a whole number of items
        raise ValueError(f"{len(raw)} bytes is not a whole number of {np.dtype(dtype).name} items") from None
