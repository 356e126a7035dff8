"""A GGUF matrix's quantized blocks as codes, scales and offsets (--quantization gguf), so the
int8 x int8 kernel's int8 and 4-bit paths run them as stored instead of dequantized to bf16.

Each row of a matrix (an output channel) is a run of blocks along the input dimension. Per type
(the bit layouts are ggml's, as gguf-py's `quants` module reads them; `decode` mirrors those
reads and tests/model/test_gguf_blocks.py holds the result to gguf's own dequantization, bit for
bit):

    type   block  what it holds                                     here
    Q8_0    32    fp16 d, 32 int8 q; w = d q                         int8 codes, S = d (G 32)
    Q4_0    32    fp16 d, 16 bytes of nibbles; w = d (q - 8)          4-bit codes, S = d, O = -8 d
    Q4_1    32    fp16 d, fp16 m, nibbles; w = d q + m                4-bit codes, S = d, O = m
    Q5_0    32    fp16 d, 32 high bits, nibbles; w = d (q - 16)       int8 codes q - 16, S = d
    Q5_1    32    fp16 d, fp16 m, high bits, nibbles; w = d q + m     int8 codes q, S = d, O = m
                  (llama-quantize's Q4_K_M falls back to Q5_0 for rows not a multiple of 256)
    Q4_K   256    fp16 d, dmin; 8 x 6-bit (sc, m); nibbles;           4-bit codes, S = d sc, O = -(dmin m) (G 32)
                  w = d sc q - dmin m per 32
    Q5_K   256    as Q4_K, plus a fifth bit per value                 int8 codes 0..31 with offsets (G 32)
    Q6_K   256    16 int8 scales, 6-bit q, fp16 d; w = d sc (q - 32)  int8 codes q - 32, S = d sc (G 16)
                  per 16

Every product (d sc, dmin m, d q) is computed in float32 in gguf's order, so `dequantize()` of
what this returns equals `gguf.quants.dequantize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

QK_K = 256  # values per K-quant super-block
K_SCALE_BYTES = 12  # Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins
STORED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class DecodedBlocks:
    """A matrix [rows, cols] as codes C, scales S and offsets O (None: 0) per `group_size`
    columns: W = C * S + O. `bits` 4: C uint8 in [0, 15]; 8: C int8."""

    codes: torch.Tensor  # [rows, cols]
    scales: torch.Tensor  # float32 [rows, cols / G]
    offsets: torch.Tensor | None
    group_size: int
    bits: int


def _f16(raw: np.ndarray) -> np.ndarray:
    """float32 of the fp16 values in the last axis's byte pairs."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _low_high_nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """[..., chunks * run] bytes -> [..., chunks * 2 * run] codes: each chunk of `run` bytes gives
    its low nibbles, then its high nibbles."""
    lead = qs.shape[:-1]
    chunks = qs.reshape(*lead, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
    return (chunks & np.uint8(0x0F)).reshape(*lead, -1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's packing: the low six
    bits of bytes 0-3 and 4-7 for the first four of each, the last four split over bytes 8-11 and
    the top two bits of bytes 0-7)."""
    lead = scales.shape[:-1]
    d, m, m_d = np.split(scales.reshape(*lead, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(*lead, 8), mn.reshape(*lead, 8)


def decode(type_name: str, raw: np.ndarray, rows: int, cols: int) -> DecodedBlocks:
    """The blocks of a [rows, cols] matrix of `type_name` (one of STORED_TYPES; `raw` its bytes)."""
    blocks = np.asarray(raw, dtype=np.uint8).reshape(rows, -1)
    if type_name == "Q8_0":
        b = blocks.reshape(rows, cols // 32, 34)
        q = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, cols)
        return DecodedBlocks(torch.from_numpy(q.copy()), torch.from_numpy(_f16(b[..., :2])[..., 0]), None, 32, 8)
    if type_name in ("Q4_0", "Q4_1"):
        size = 18 if type_name == "Q4_0" else 20
        b = blocks.reshape(rows, cols // 32, size)
        d = _f16(b[..., :2])[..., 0]
        codes = _low_high_nibbles(b[..., size - 16 :], 16).reshape(rows, cols)
        offsets = -8.0 * d if type_name == "Q4_0" else _f16(b[..., 2:4])[..., 0]
        offsets_t = torch.from_numpy(offsets.astype(np.float32))
        return DecodedBlocks(torch.from_numpy(codes), torch.from_numpy(d), offsets_t, 32, 4)
    if type_name in ("Q5_0", "Q5_1"):
        size = 22 if type_name == "Q5_0" else 24
        b = blocks.reshape(rows, cols // 32, size)
        d = _f16(b[..., :2])[..., 0]
        high_bits = np.ascontiguousarray(b[..., size - 20 : size - 16]).view(np.uint32)  # [rows, nb, 1]: bit i, value i
        high = ((high_bits >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
        codes = (_low_high_nibbles(b[..., size - 16 :], 16) | (high << np.uint8(4))).astype(np.int8).reshape(rows, cols)
        if type_name == "Q5_0":
            return DecodedBlocks(torch.from_numpy(codes - np.int8(16)), torch.from_numpy(d), None, 32, 8)
        offsets = torch.from_numpy(_f16(b[..., 2:4])[..., 0])
        return DecodedBlocks(torch.from_numpy(codes), torch.from_numpy(d), offsets, 32, 8)
    if type_name in ("Q4_K", "Q5_K"):
        size = 144 if type_name == "Q4_K" else 176
        b = blocks.reshape(rows, cols // QK_K, size)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # [rows, nb, 1]
        sc, mn = _k_scale_min(b[..., 4 : 4 + K_SCALE_BYTES])
        scales = d * sc.astype(np.float32)  # [rows, nb, 8]
        offsets = -(dmin * mn.astype(np.float32))
        codes = _low_high_nibbles(b[..., size - 128 :], 32)  # [rows, nb, 256]
        if type_name == "Q5_K":
            qh = b[..., 16:48].reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
            codes = codes | ((qh & np.uint8(1)).reshape(rows, -1, QK_K) << np.uint8(4))
        bits = 4 if type_name == "Q4_K" else 8
        codes = codes.reshape(rows, cols)
        codes_t = torch.from_numpy(codes) if bits == 4 else torch.from_numpy(codes.astype(np.int8))
        scales_t, offsets_t = torch.from_numpy(scales.reshape(rows, -1)), torch.from_numpy(offsets.reshape(rows, -1))
        return DecodedBlocks(codes_t, scales_t, offsets_t, 32, bits)
    if type_name == "Q6_K":
        b = blocks.reshape(rows, cols // QK_K, 210)
        ql = b[..., :128].reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)
        ql = (ql & np.uint8(0x0F)).reshape(rows, -1, 8, 32)
        qh = b[..., 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
        qh = (qh & np.uint8(0x03)).reshape(rows, -1, 8, 32)
        q = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(32)
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)  # [rows, nb, 16]
        scales = _f16(b[..., 208:210]) * sc
        q_t, scales_t = torch.from_numpy(q.reshape(rows, cols)), torch.from_numpy(scales.reshape(rows, -1))
        return DecodedBlocks(q_t, scales_t, None, 16, 8)
    raise ValueError(f"GGUF type {type_name} is not kept as stored (expected one of {', '.join(STORED_TYPES)})")
