"""Random GGUF blocks of any type zserve keeps as stored (model_proc/weights/gguf_blocks.py): random bytes
with every fp16 field (d, dmin, m) finite, for types gguf cannot quantize to (Q2_K, Q3_K, IQ4_NL,
IQ4_XS) and to hold the decoders to gguf's dequantization on arbitrary bits.

    magnitude None   each fp16 field any finite value (random bits, exponent not all ones)
    magnitude m      each field in [0.5, 1] x m / its peak factor (the largest |code x scale| it
                     multiplies), so values stay within about +-m: weights a tiny model can run
"""

from __future__ import annotations

import numpy as np

from zserve.model_proc.weights.gguf_blocks import block_type

# type -> ((byte offset of an fp16 field in the block, its peak factor), ...)
FP16_FIELDS = {
    "Q8_0": ((0, 127),),
    "Q4_0": ((0, 8),),
    "Q4_1": ((0, 15), (2, 1)),
    "Q5_0": ((0, 16),),
    "Q5_1": ((0, 31), (2, 1)),
    "IQ4_NL": ((0, 127),),
    "Q2_K": ((80, 2 * 15 * 3), (82, 15)),  # d: sc 0..15 x q 0..3 spans 2 m; dmin x m 0..15 centres it
    "Q3_K": ((108, 32 * 4),),  # sc - 32 in -32..31, q in -4..3
    "Q4_K": ((0, 2 * 63 * 15), (2, 63)),
    "Q5_K": ((0, 2 * 63 * 31), (2, 63)),
    "Q6_K": ((208, 128 * 32),),
    "IQ4_XS": ((0, 32 * 127),),  # ls - 32 in -32..31, table values in -127..113
}
FP16_EXPONENT_BITS = np.uint16(0x7C00)


def random_blocks(type_name: str, rows: int, cols: int, seed: int, magnitude: float | None = None) -> np.ndarray:
    """uint8 [rows, cols / block values * block bytes]: a [rows, cols] matrix of random `type_name`
    blocks; see the top for `magnitude`."""
    traits = block_type(type_name)
    rng = np.random.default_rng(seed)
    num_blocks = rows * cols // traits.num_block_values
    blocks = rng.integers(0, 256, size=(num_blocks, traits.num_block_bytes), dtype=np.uint8)
    for offset, peak in FP16_FIELDS[type_name]:
        if magnitude is None:
            bits = rng.integers(0, 1 << 16, size=num_blocks, dtype=np.uint16)
            infinite = (bits & FP16_EXPONENT_BITS) == FP16_EXPONENT_BITS
            bits[infinite] &= ~np.uint16(0x4000)  # a top exponent bit cleared: finite
            field = bits
        else:
            field = (rng.uniform(0.5, 1.0, num_blocks) * magnitude / peak).astype(np.float16).view(np.uint16)
        blocks[:, offset : offset + 2] = field.view(np.uint8).reshape(num_blocks, 2)
    return blocks.reshape(rows, -1)
