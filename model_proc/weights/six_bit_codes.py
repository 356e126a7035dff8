"""6-bit codes in the int8 x int8 GEMM's column blocks (GGUF Q6_K at its stored size), in torch:
the reference for kernels/six_bit_codes.h's layout, and the decoding PackedBlocks uses off the
kernel's path (an embedding lookup, `unpacked()`).

A code C + 32 in [0, 63] stands for the int8 code C. Per column block, K / 16 units of three
64-byte rows; in unit u, column j, byte i (k = 16u + 4s + i, s = 0..3):

    row 3u      (C+32)[16u + i] & 15      | ((C+32)[16u + 4 + i] & 15) << 4     the nibble layout's
    row 3u + 1  (C+32)[16u + 8 + i] & 15  | ((C+32)[16u + 12 + i] & 15) << 4    bytes for these k
    row 3u + 2  sum over s of ((C+32)[16u + 4s + i] >> 4) << 2s                  the 2 high bits
"""

from __future__ import annotations

import torch

from zserve.model_proc.weights.column_blocks import BLOCK_COLS, padded_cols

K_PER_UNIT = 16
CODE_OFFSET = 32  # stored C + 32


def pack_six_bit(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [K, N] in [-32, 31] (K a multiple of 16) -> uint8 [ceil(N / 16), 3K / 16, 16, 4]
    (code 0, stored 32, past N)."""
    k, n = codes.shape
    padded_n = padded_cols(n)
    padded = torch.full((k, padded_n), CODE_OFFSET, dtype=torch.uint8)
    padded[:, :n] = (codes.to(torch.int16) + CODE_OFFSET).to(torch.uint8)
    # [K/16, 4 (s), 4 (i), NB, 16] -> [NB, K/16, 16, 4 (s), 4 (i)]
    units = padded.view(k // K_PER_UNIT, 4, 4, padded_n // BLOCK_COLS, BLOCK_COLS).permute(3, 0, 4, 1, 2)
    low, high = units & 0x0F, units >> 4
    rows = torch.stack([
        low[..., 0, :] | (low[..., 1, :] << 4),
        low[..., 2, :] | (low[..., 3, :] << 4),
        high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6),
    ], dim=2)  # [NB, K/16, 3, 16, 4]
    return rows.reshape(padded_n // BLOCK_COLS, 3 * k // K_PER_UNIT, BLOCK_COLS, 4).contiguous()


def six_bit_codes(lanes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3K / 16, 4] (one column's rows of the layout) -> int16 codes C [..., K]."""
    *lead, num_rows, _ = lanes.shape
    units = lanes.reshape(*lead, num_rows // 3, 3, 4).to(torch.int16)
    low0, low1, high = units[..., 0, :], units[..., 1, :], units[..., 2, :]
    codes = torch.stack([
        (low0 & 0x0F) | ((high & 0x03) << 4),
        (low0 >> 4) | (((high >> 2) & 0x03) << 4),
        (low1 & 0x0F) | (((high >> 4) & 0x03) << 4),
        (low1 >> 4) | (((high >> 6) & 0x03) << 4),
    ], dim=-2)  # [..., K/16, 4 (s), 4 (i)]
    return codes.reshape(*lead, num_rows // 3 * K_PER_UNIT) - CODE_OFFSET
