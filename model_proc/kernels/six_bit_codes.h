// 6-bit codes (GGUF Q6_K kept at its stored size, 0.75 byte a weight plus its scales) in the
// int8 x int8 GEMM's column blocks: gguf_pack.cpp writes them, gemm_int8_dot.cpp decodes them in
// registers, and a kernel that reads int8 quads (C + 128) expands a k range with `expand_to_quads`.
//
// A code C in [0, 63] stands for the int8 value C - 32 (Q6_K's q). One column block (16 output
// columns) is K / 16 units of 192 bytes, one unit per 16 k; unit u, for column j and i in 0..3:
//
//   bytes [  0,  64)  low nibbles:  byte (j, i) = C[16u + i]     & 15  |  (C[16u + 4 + i]  & 15) << 4
//   bytes [ 64, 128)  low nibbles:  byte (j, i) = C[16u + 8 + i] & 15  |  (C[16u + 12 + i] & 15) << 4
//   bytes [128, 192)  2-bit plane:  byte (j, i) = sum over s in 0..3 of (C[16u + 4s + i] >> 4) << 2s
//
// (byte (j, i) of a 64-byte row is byte 4j + i: the quad layout's 4-byte lane of column j). The first
// two rows are the 4-bit layout's nibbles (two 64-byte loads of 16 columns x 8 k), so the dot path
// ORs the 2 high bits into each: k 16u + 4s + i gets its bits 4-5 from bits 2s..2s+1 of the plane.
// As a tensor: uint8 [NB, 3K / 16, 16, 4] (rows 3u, 3u + 1, 3u + 2 of unit u).
#pragma once

#include <cstdint>
#include <cstring>

namespace zserve_six_bit {

constexpr int64_t K_PER_UNIT = 16;
constexpr int64_t COLS = 16;
constexpr int64_t ROW_BYTES = COLS * 4;         // one 64-byte row: 16 columns x 4 bytes
constexpr int64_t UNIT_BYTES = 3 * ROW_BYTES;   // 192 bytes per 16 k of one column block
constexpr int32_t CODE_OFFSET = 32;             // C = q + 32
constexpr uint8_t ZERO_CODE = CODE_OFFSET;      // q = 0: columns past N

inline int64_t block_bytes(int64_t K) { return K / K_PER_UNIT * UNIT_BYTES; }

inline uint32_t load_lane(const uint8_t* p) {
  uint32_t lane;
  std::memcpy(&lane, p, 4);
  return lane;
}

inline void store_lane(uint8_t* p, uint32_t lane) { std::memcpy(p, &lane, 4); }

// One column's 16 codes (k 16u .. 16u + 15, each in [0, 63]) -> its three 4-byte lanes of unit u.
inline void pack_lanes(const uint8_t* codes, uint32_t& low0, uint32_t& low1, uint32_t& high) {
  uint32_t c[4];
  for (int s = 0; s < 4; ++s) c[s] = load_lane(codes + 4 * s);
  low0 = (c[0] & 0x0F0F0F0Fu) | ((c[1] & 0x0F0F0F0Fu) << 4);
  low1 = (c[2] & 0x0F0F0F0Fu) | ((c[3] & 0x0F0F0F0Fu) << 4);
  high = 0;
  for (int s = 0; s < 4; ++s) high |= ((c[s] >> 4) & 0x03030303u) << (2 * s);  // codes < 64: 2 bits per byte
}

// Column j's lanes of unit u -> its 16 codes as 4 lanes of 4 (k 16u + 4s + i in byte i of lane s).
inline void unpack_lanes(uint32_t low0, uint32_t low1, uint32_t high, uint32_t* codes4) {
  codes4[0] = (low0 & 0x0F0F0F0Fu) | ((high << 4) & 0x30303030u);
  codes4[1] = ((low0 >> 4) & 0x0F0F0F0Fu) | ((high << 2) & 0x30303030u);
  codes4[2] = (low1 & 0x0F0F0F0Fu) | (high & 0x30303030u);
  codes4[3] = ((low1 >> 4) & 0x0F0F0F0Fu) | ((high >> 2) & 0x30303030u);
}

// k range [k0, k1) (multiples of 16) of one column block (`block`: its first byte) -> the int8 quad
// layout of gemm_int8_dot.cpp, q + 128 = C + 96: quads[(k - k0) / 4][j][i] for k = 4 * (k / 4) + i,
// (k1 - k0) * 16 bytes. For a kernel that reads quads (AMX-INT8's tiles: fill a tile buffer from here).
inline void expand_to_quads(const uint8_t* block, int64_t k0, int64_t k1, uint8_t* quads) {
  constexpr uint32_t TO_QUAD = 0x60606060u;  // + 96 in each byte: C <= 63, so no carry
  for (int64_t u = k0 / K_PER_UNIT; u < k1 / K_PER_UNIT; ++u) {
    const uint8_t* unit = block + u * UNIT_BYTES;
    uint8_t* out = quads + (u - k0 / K_PER_UNIT) * 4 * ROW_BYTES;
    for (int64_t j = 0; j < COLS; ++j) {
      uint32_t codes4[4];
      unpack_lanes(load_lane(unit + 4 * j), load_lane(unit + ROW_BYTES + 4 * j), load_lane(unit + 2 * ROW_BYTES + 4 * j), codes4);
      for (int s = 0; s < 4; ++s) store_lane(out + s * ROW_BYTES + 4 * j, codes4[s] + TO_QUAD);
    }
  }
}

}  // namespace zserve_six_bit
