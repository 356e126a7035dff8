"""Decoders of GGUF's super-blocks of 256 values (the K-quants and IQ4_XS) into codes, scales and
offsets per sub-block of 16 or 32 values.

Each takes a matrix's bytes as uint8 [rows, super-blocks per row, block bytes] and mirrors
gguf-py's `quants` reads of the layout (ggml's; offsets into the block in bytes):

    type   bytes  what it holds                                          here
    Q2_K     84   0 16 x (4-bit sc | 4-bit m << 4), 16 qs (2-bit q),     int8 codes q 0..3, S = d sc,
                  80 fp16 d, 82 fp16 dmin; w = d sc q - dmin m per 16    O = -(dmin m) (G 16)
    Q3_K    110   0 hmask (a high bit per value), 32 qs (2-bit low q),   int8 codes q -4..3,
                  96 12 bytes of 6-bit sc, 108 fp16 d;                   S = d (sc - 32) (G 16)
                  q = low - 4 where the high bit is 0; w = d (sc - 32) q per 16
    Q4_K    144   0 fp16 d, 2 dmin; 4 8 x 6-bit (sc, m); 16 nibbles;     4-bit codes, S = d sc,
                  w = d sc q - dmin m per 32                             O = -(dmin m) (G 32)
    Q5_K    176   as Q4_K, 16 a fifth bit per value, 48 nibbles          int8 codes 0..31, offsets (G 32)
    Q6_K    210   0 low nibbles, 128 high 2 bits, 192 16 int8 sc,        int8 codes q - 32, S = d sc (G 16)
                  208 fp16 d; w = d sc (q - 32) per 16
    IQ4_XS  136   0 fp16 d, 2 uint16 of 8 x 2 high scale bits, 4 8 x    int8 codes t[q], S = d (ls - 32)
                  low nibbles, 8 nibbles indexing IQ4_VALUES;            (G 32)
                  w = d (ls - 32) t[q] per 32

Every product (d sc, dmin m, d sc q) is float32 in gguf's order, so C * S + O equals gguf's
dequantization bit for bit (a - b is a + (-b) in IEEE arithmetic).
"""

from __future__ import annotations

import numpy as np

from zserve.model_proc.weights.gguf_decoded_blocks import DecodedBlocks, bit_planes, f16, grouped
from zserve.model_proc.weights.gguf_small_blocks import IQ4_VALUES

QK_K = 256  # values per super-block
K_SCALE_BYTES = 12  # Q3_K's 16 six-bit scales; Q4_K's / Q5_K's 8 six-bit scales and 8 mins


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's packing: the low six
    bits of bytes 0-3 and 4-7 for the first four of each, the last four split over bytes 8-11 and
    the top two bits of bytes 0-7)."""
    lead = scales.shape[:-1]
    d, m, m_d = np.split(scales.reshape(*lead, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(*lead, 8), mn.reshape(*lead, 8)


def _q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K: 12 bytes -> 16 six-bit scales minus 32 (int8): the low 4 bits from bytes 0-7 (low
    nibbles, then high), the top 2 from bytes 8-11 (2-bit fields, lowest first)."""
    low = bit_planes(scales[..., :8], 8, 4)
    high = bit_planes(scales[..., 8:12], 4, 2)
    return (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)


def decode_q2_k(blocks: np.ndarray) -> DecodedBlocks:
    sc = blocks[..., :16]
    d, dmin = f16(blocks[..., 80:82]), f16(blocks[..., 82:84])  # [rows, nb, 1]
    scales = d * (sc & np.uint8(0x0F)).astype(np.float32)  # [rows, nb, 16]
    offsets = -(dmin * (sc >> np.uint8(4)).astype(np.float32))
    return grouped(bit_planes(blocks[..., 16:80], 32, 2), scales, offsets, 16, 8)


def decode_q3_k(blocks: np.ndarray) -> DecodedBlocks:
    low = bit_planes(blocks[..., 32:96], 32, 2).astype(np.int8)
    missing_high = (bit_planes(blocks[..., :32], 32, 1) ^ np.uint8(1)) << np.uint8(2)  # 4 where the hmask bit is 0
    scales = f16(blocks[..., 108:110]) * _q3_k_scales(blocks[..., 96:108]).astype(np.float32)
    return grouped(low - missing_high.astype(np.int8), scales, None, 16, 8)


def _decode_q4_k_q5_k(blocks: np.ndarray, fifth_bits: np.ndarray | None) -> DecodedBlocks:
    d, dmin = f16(blocks[..., 0:2]), f16(blocks[..., 2:4])  # [rows, nb, 1]
    sc, mn = _k_scale_min(blocks[..., 4 : 4 + K_SCALE_BYTES])
    scales = d * sc.astype(np.float32)  # [rows, nb, 8]
    offsets = -(dmin * mn.astype(np.float32))
    codes = bit_planes(blocks[..., -128:], 32, 4)  # [rows, nb, 256]
    if fifth_bits is None:
        return grouped(codes, scales, offsets, 32, 4)
    return grouped(codes | (fifth_bits << np.uint8(4)), scales, offsets, 32, 8)


def decode_q4_k(blocks: np.ndarray) -> DecodedBlocks:
    return _decode_q4_k_q5_k(blocks, None)


def decode_q5_k(blocks: np.ndarray) -> DecodedBlocks:
    return _decode_q4_k_q5_k(blocks, bit_planes(blocks[..., 16:48], 32, 1))


def decode_q6_k(blocks: np.ndarray) -> DecodedBlocks:
    low = bit_planes(blocks[..., :128], 64, 4)
    high = bit_planes(blocks[..., 128:192], 32, 2)
    codes = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)  # [rows, nb, 16]
    return grouped(codes, f16(blocks[..., 208:210]) * sc, None, 16, 8)


def decode_iq4_xs(blocks: np.ndarray) -> DecodedBlocks:
    high_words = np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)  # [rows, nb, 1]: bits 2i, 2i+1 for sub-block i
    high = ((high_words >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)).astype(np.uint8)
    low = bit_planes(blocks[..., 4:8], 1, 4)  # byte i: sub-block 2i's low nibble, then 2i+1's
    ls = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    scales = f16(blocks[..., 0:2]) * ls.astype(np.float32)  # [rows, nb, 8]
    return grouped(IQ4_VALUES[bit_planes(blocks[..., 8:], 16, 4)], scales, None, 32, 8)
