"""The GGUF block types zserve keeps as stored (--quantization gguf), one traits record each (as
ggml's `type_traits`), so the int8 x int8 kernel's int8 and 4-bit paths run a file's quantized
matrices as codes, scales and offsets instead of dequantized to bf16.

    type    block  bytes  codes  G   offsets  resident bytes / weight (fp32 S, O per group)
    Q8_0      32     34   int8   32     -     1.125
    Q4_0      32     18   4-bit  32    yes    0.75
    Q4_1      32     20   4-bit  32    yes    0.75
    Q5_0      32     22   int8   32     -     1.125
    Q5_1      32     24   int8   32    yes    1.25
    IQ4_NL    32     18   int8   32     -     1.125
    Q2_K     256     84   int8   16    yes    1.5
    Q3_K     256    110   int8   16     -     1.25
    Q4_K     256    144   4-bit  32    yes    0.75
    Q5_K     256    176   int8   32    yes    1.25
    Q6_K     256    210   int8   16     -     1.25
    IQ4_XS   256    136   int8   32     -     1.125

The bit layouts and decoders: gguf_small_blocks.py (blocks of 32) and gguf_super_blocks.py
(super-blocks of 256). tests/model/test_gguf_blocks.py holds `decode` to gguf's own
dequantization, bit for bit, for every type here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zserve.model_proc.weights import gguf_small_blocks as small
from zserve.model_proc.weights import gguf_super_blocks as sup
from zserve.model_proc.weights.gguf_decoded_blocks import DecodedBlocks

__all__ = ["BLOCK_TYPES", "STORED_TYPES", "BlockType", "DecodedBlocks", "block_type", "decode", "file_bytes"]

SCALE_BYTES = 4  # a float32 scale (or offset) per group and output column, as the kernels keep them


@dataclass(frozen=True)
class BlockType:
    """One GGUF block type: `num_block_values` values in `num_block_bytes` bytes, decoded by
    `decode_blocks` (uint8 [rows, blocks per row, num_block_bytes] -> DecodedBlocks) into
    `code_bits`-bit codes (4: uint8 0..15, the 4-bit path; 8: int8) with a scale (and an offset
    where `has_offsets`) per `group_size` input columns."""

    name: str
    num_block_values: int
    num_block_bytes: int
    decode_blocks: Callable[[np.ndarray], DecodedBlocks]
    code_bits: int
    group_size: int
    has_offsets: bool

    @property
    def file_bytes_per_weight(self) -> float:
        return self.num_block_bytes / self.num_block_values

    @property
    def resident_bytes_per_weight(self) -> float:
        """Bytes a weight takes packed for the int8 x int8 kernel: its code, and its share of the
        fp32 scale (and offset) of its group (the torch reference widens 4-bit codes to a byte)."""
        per_group = SCALE_BYTES * (1 + self.has_offsets)
        return self.code_bits / 8 + per_group / self.group_size


BLOCK_TYPES: dict[str, BlockType] = {
    t.name: t
    for t in (
        BlockType("Q8_0", 32, 34, small.decode_q8_0, 8, 32, False),
        BlockType("Q4_0", 32, 18, small.decode_q4_0, 4, 32, True),
        BlockType("Q4_1", 32, 20, small.decode_q4_1, 4, 32, True),
        BlockType("Q5_0", 32, 22, small.decode_q5_0, 8, 32, False),
        BlockType("Q5_1", 32, 24, small.decode_q5_1, 8, 32, True),
        BlockType("IQ4_NL", 32, 18, small.decode_iq4_nl, 8, 32, False),
        BlockType("Q2_K", 256, 84, sup.decode_q2_k, 8, 16, True),
        BlockType("Q3_K", 256, 110, sup.decode_q3_k, 8, 16, False),
        BlockType("Q4_K", 256, 144, sup.decode_q4_k, 4, 32, True),
        BlockType("Q5_K", 256, 176, sup.decode_q5_k, 8, 32, True),
        BlockType("Q6_K", 256, 210, sup.decode_q6_k, 8, 16, False),
        BlockType("IQ4_XS", 256, 136, sup.decode_iq4_xs, 8, 32, False),
    )
}
STORED_TYPES = tuple(BLOCK_TYPES)


def block_type(type_name: str) -> BlockType:
    """The traits of `type_name`, one of STORED_TYPES."""
    traits = BLOCK_TYPES.get(type_name)
    if traits is None:
        raise ValueError(f"GGUF type {type_name} is not kept as stored (expected one of {', '.join(STORED_TYPES)})")
    return traits


def decode(type_name: str, raw: np.ndarray, rows: int, cols: int) -> DecodedBlocks:
    """The blocks of a [rows, cols] matrix of `type_name` (one of STORED_TYPES; `raw` its bytes)."""
    traits = block_type(type_name)
    num_blocks = cols // traits.num_block_values
    blocks = np.asarray(raw, dtype=np.uint8)
    if cols % traits.num_block_values or blocks.size != rows * num_blocks * traits.num_block_bytes:
        raise ValueError(f"{blocks.size} bytes are no [{rows}, {cols}] {type_name} matrix "
                         f"({traits.num_block_values} values in {traits.num_block_bytes} bytes a block)")
    return traits.decode_blocks(blocks.reshape(rows, num_blocks, traits.num_block_bytes))


def file_bytes(type_name: str, num_values: int) -> int:
    """Bytes `num_values` values of `type_name` take in a GGUF file: any of gguf's types (F32,
    F16 and the types not kept as stored too), `num_values` a whole number of blocks."""
    traits = BLOCK_TYPES.get(type_name)
    if traits is not None:
        num_block_values, num_block_bytes = traits.num_block_values, traits.num_block_bytes
    else:
        import gguf

        num_block_values, num_block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    assert num_values % num_block_values == 0, (type_name, num_values, num_block_values)
    return num_values // num_block_values * num_block_bytes
