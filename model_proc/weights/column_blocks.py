"""The block layouts zserve's CPU kernels read: output columns in blocks of 16, zero-padded.

    pack_column_blocks  [R, N] -> [ceil(N / 16), R, 16]      gemm_widen.cpp (16-bit weights),
                                                           gemm_int8.cpp (int8 values, their scales)
    pack_bf16_blocks    [K, N] -> [ceil(N / 16), K / 2, 16]  gemm_bf16.cpp (pairs of k in one int32)
    pack_int8_quads     [K, N] -> [ceil(N / 16), K / 4, 16, 4]  gemm_int8_dot.cpp (Q + 128, 4 k per column)
    pack_int4_nibbles   [K, N] -> [ceil(N / 16), K / 8, 16, 4]  gemm_int4_dot (two quads of codes per byte)
    pack_six_bit        [K, N] -> [ceil(N / 16), 3K / 16, 16, 4]  gemm_dot_compact's 6-bit codes (six_bit_codes.py)

A decode step then streams each block's rows in order, once.
"""

from __future__ import annotations

import torch

from zserve.common.int_math import cdiv

BLOCK_COLS = 16  # output columns per packed block


def padded_cols(n: int) -> int:
    return cdiv(n, BLOCK_COLS) * BLOCK_COLS


def pack_column_blocks(values: torch.Tensor) -> torch.Tensor:
    """[R, N] -> same dtype [ceil(N / 16), R, 16]: block b, row r, column j holds values[r, 16b + j]
    (zero past N). A weight [K, N], int8 values [K, N] or their scales [K / G, N]."""
    rows, n = values.shape
    padded = torch.zeros(rows, padded_cols(n), dtype=values.dtype, device=values.device)
    padded[:, :n] = values
    return padded.view(rows, padded_cols(n) // BLOCK_COLS, BLOCK_COLS).permute(1, 0, 2).contiguous()


def pack_bf16_blocks(weight_in_out: torch.Tensor) -> torch.Tensor:
    """bf16 [K, N] (K even) -> int32 [ceil(N / 16), K / 2, 16]: block b, pair p, column j holds
    (W[2p, 16b + j], W[2p + 1, 16b + j])."""
    k, n = weight_in_out.shape
    padded_n = padded_cols(n)
    padded = torch.zeros(k, padded_n, dtype=torch.bfloat16, device=weight_in_out.device)
    padded[:, :n] = weight_in_out
    # [K/2, 2, NB, 16] -> [NB, K/2, 16, 2]
    blocks = padded.view(k // 2, 2, padded_n // BLOCK_COLS, BLOCK_COLS).permute(2, 0, 3, 1).contiguous()
    return blocks.view(torch.int32).view(padded_n // BLOCK_COLS, k // 2, BLOCK_COLS)


def pack_int8_quads(q: torch.Tensor) -> torch.Tensor:
    """int8 [K, N] (K a multiple of 4) -> uint8 [ceil(N / 16), K / 4, 16, 4]: block b, quad p,
    column j, i holds Q[4p + i, 16b + j] + 128 (128, a zero, past N)."""
    k, n = q.shape
    padded_n = padded_cols(n)
    padded = torch.zeros(k, padded_n, dtype=torch.int16, device=q.device)
    padded[:, :n] = q.to(torch.int16)
    shifted = (padded + 128).to(torch.uint8)
    # [K/4, 4, NB, 16] -> [NB, K/4, 16, 4]
    return shifted.view(k // 4, 4, padded_n // BLOCK_COLS, BLOCK_COLS).permute(2, 0, 3, 1).contiguous()


def pack_int4_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [K, N] in [0, 15] (K a multiple of 8) -> uint8 [ceil(N / 16), K / 8, 16, 4]:
    block b, octet p, column j, byte i holds C[8p + i, 16b + j] | C[8p + 4 + i, 16b + j] << 4
    (0 past N)."""
    k, n = codes.shape
    padded_n = padded_cols(n)
    padded = torch.zeros(k, padded_n, dtype=torch.uint8, device=codes.device)
    padded[:, :n] = codes
    # [K/8, 2 (low, high), 4, NB, 16] -> [NB, K/8, 16, 2, 4]
    octets = padded.view(k // 8, 2, 4, padded_n // BLOCK_COLS, BLOCK_COLS).permute(3, 0, 4, 1, 2)
    return (octets[..., 0, :] | (octets[..., 1, :] << 4)).contiguous()


def padded_bias(bias: torch.Tensor | None, num_blocks: int) -> torch.Tensor | None:
    """float32 [num_blocks * 16]: the bias the block kernels add in fp32, zero past the outputs
    (None for none)."""
    if bias is None:
        return None
    padded = torch.zeros(num_blocks * BLOCK_COLS, dtype=torch.float32)
    padded[: bias.numel()] = bias.detach().float()
    return padded
