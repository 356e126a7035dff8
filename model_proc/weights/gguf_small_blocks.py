"""Decoders of GGUF's blocks of 32 values (one fp16 scale d each) into codes, scales and offsets.

Each takes a matrix's bytes as uint8 [rows, blocks per row, block bytes] (a row is an output
channel, its blocks run along the input dimension) and mirrors gguf-py's `quants` reads of the
layout (ggml's):

    type    bytes  what it holds                                   here (G 32)
    Q8_0     34    fp16 d, 32 int8 q; w = d q                      int8 codes q, S = d
    Q4_0     18    fp16 d, 16 bytes of nibbles; w = d (q - 8)      4-bit codes q, S = d, O = -8 d
    Q4_1     20    fp16 d, fp16 m, nibbles; w = d q + m            4-bit codes q, S = d, O = m
    Q5_0     22    fp16 d, 32 high bits, nibbles; w = d (q - 16)   int8 codes q - 16, S = d
    Q5_1     24    fp16 d, fp16 m, high bits, nibbles; w = d q + m int8 codes q, S = d, O = m
    IQ4_NL   18    fp16 d, nibbles indexing IQ4_VALUES; w = d t[q] int8 codes t[q], S = d

fp16 d times a code of a few bits is exact in float32, so C * S + O rounds (at most once, in the
sum) exactly as gguf's expression does.
"""

from __future__ import annotations

import numpy as np

from zserve.model_proc.weights.gguf_decoded_blocks import DecodedBlocks, bit_planes, f16, grouped

SMALL_BLOCK = 32  # values per block
# ggml's non-linear 4-bit grid (kvalues_iq4nl), IQ4_NL's and IQ4_XS's codes
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A block's 16 bytes -> its 32 four-bit codes: the low nibbles, then the high ones."""
    return bit_planes(qs, SMALL_BLOCK // 2, 4)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1: 4 bytes, one little-endian uint32 whose bit i is value i's fifth bit -> [..., 32]."""
    words = np.ascontiguousarray(qh).view(np.uint32)  # [..., 1]
    return ((words >> np.arange(SMALL_BLOCK, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def decode_q8_0(blocks: np.ndarray) -> DecodedBlocks:
    codes = np.ascontiguousarray(blocks[..., 2:]).view(np.int8)
    return grouped(codes, f16(blocks[..., :2]), None, SMALL_BLOCK, 8)


def decode_q4_0(blocks: np.ndarray) -> DecodedBlocks:
    d = f16(blocks[..., :2])
    return grouped(_nibbles(blocks[..., 2:]), d, np.float32(-8.0) * d, SMALL_BLOCK, 4)


def decode_q4_1(blocks: np.ndarray) -> DecodedBlocks:
    return grouped(_nibbles(blocks[..., 4:]), f16(blocks[..., :2]), f16(blocks[..., 2:4]), SMALL_BLOCK, 4)


def decode_q5_0(blocks: np.ndarray) -> DecodedBlocks:
    codes = (_nibbles(blocks[..., 6:]) | (_fifth_bits(blocks[..., 2:6]) << np.uint8(4))).astype(np.int8)
    return grouped(codes - np.int8(16), f16(blocks[..., :2]), None, SMALL_BLOCK, 8)


def decode_q5_1(blocks: np.ndarray) -> DecodedBlocks:
    codes = _nibbles(blocks[..., 8:]) | (_fifth_bits(blocks[..., 4:8]) << np.uint8(4))
    return grouped(codes, f16(blocks[..., :2]), f16(blocks[..., 2:4]), SMALL_BLOCK, 8)


def decode_iq4_nl(blocks: np.ndarray) -> DecodedBlocks:
    return grouped(IQ4_VALUES[_nibbles(blocks[..., 2:])], f16(blocks[..., :2]), None, SMALL_BLOCK, 8)
