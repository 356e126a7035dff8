// What gemm_int8_dot.cpp (the int8 x int8 GEMM, VPDPBUSD / VPMADDUBSW) and gemm_amx.cpp (its rows
// in AMX tiles) share: the activation blocks, the kinds of codes, where a column block's weights
// are, and the AMX entry points.
#pragma once

#include "cpu_gemm.h"

namespace zserve_int8_dot {

using namespace zserve_gemm;

constexpr int64_t ACT_BLOCK = 32;  // k per activation scale
constexpr int64_t QUAD = 4;        // k per 32-bit lane of a dot product
constexpr int64_t SUM_BLOCK = 16;  // k per partial sum of xq the quantizer hands over
constexpr int64_t AMX_MIN_ROWS = 16;  // from this many rows, whole tiles of 16 rows go through AMX (cpu_isa.py's AMX_MIN_ROWS)

// int8 C (stored C + 128) in quads; unsigned 4-bit codes in nibble pairs of quads; 6-bit C + 32 (six_bit_codes.h)
enum class Codes { INT8, NIBBLES, SIX };

#if ZSERVE_HAS_GEMM_WIDEN

// One column block's weights. Its scales S (and offsets O) per group of G k: fp32 [NG, 16], or
// compact (weights/compact_scales.py, a GGUF file's own): S[g] = fp16 super[g / R] * int8 sub[g].
struct Weights {
  const uint8_t* codes;    // this column block's codes
  const float* scales;     // [NG, 16], or null (compact)
  const float* offsets;    // [NG, 16] or null
  int64_t G;
  const c10::Half* scale_supers = nullptr;   // compact: [NG / R, 16]
  const int8_t* scale_subs = nullptr;        // compact: [NG, 16], or null (one group per super: S is the super)
  const c10::Half* offset_supers = nullptr;  // compact: [NG / R, 16] (the scale supers where they are shared)
  const int8_t* offset_subs = nullptr;       // compact: [NG, 16], or null (no offsets, or the implied ones)
  int64_t R = 1;                             // compact: groups per super
  int32_t implied_offset = 0;                // compact without subs: O = float(offset super) * implied_offset (Q4_0: -8)

  bool has_offsets() const { return offsets != nullptr || offset_subs != nullptr || implied_offset != 0; }

  // group g's S (and O) for the block's 16 columns, in fp32: one product each where compact
  inline void group(int64_t g, vec* scale, vec* offset) const {
    if (scales != nullptr) {
      for (int v = 0; v < NV; ++v) scale[v] = vload(scales + g * COLS + v * LANES);
      if (offsets != nullptr)
        for (int v = 0; v < NV; ++v) offset[v] = vload(offsets + g * COLS + v * LANES);
      return;
    }
    const int64_t super = g / R;
    for (int v = 0; v < NV; ++v)  // no subs: each a factor 1, and super * 1.0f is the super
      scale[v] = scale_subs != nullptr ? vmul(widen(scale_supers + super * COLS + v * LANES), widen(scale_subs + g * COLS + v * LANES))
                                       : widen(scale_supers + super * COLS + v * LANES);
    if (offset_subs != nullptr) {
      for (int v = 0; v < NV; ++v)
        offset[v] = vmul(widen(offset_supers + super * COLS + v * LANES), widen(offset_subs + g * COLS + v * LANES));
    } else if (implied_offset != 0) {  // the same fp32 product as a stored int8 factor's
      for (int v = 0; v < NV; ++v) offset[v] = vmul(widen(offset_supers + super * COLS + v * LANES), vset1(static_cast<float>(implied_offset)));
    }
  }
};

// Where every column block's weights are: `at(b)` is block b's.
struct WeightLayout {
  Weights first;  // block 0's
  int64_t block_bytes, num_groups, num_supers;

  Weights at(int64_t b) const {
    Weights w = first;
    w.codes += b * block_bytes;
    if (w.scales != nullptr) w.scales += b * num_groups * COLS;
    if (w.offsets != nullptr) w.offsets += b * num_groups * COLS;
    if (w.scale_supers != nullptr) w.scale_supers += b * num_supers * COLS;
    if (w.scale_subs != nullptr) w.scale_subs += b * num_groups * COLS;
    if (w.offset_supers != nullptr) w.offset_supers += b * num_supers * COLS;
    if (w.offset_subs != nullptr) w.offset_subs += b * num_groups * COLS;
    return w;
  }
};

// gemm_amx.cpp. Whether this process multiplies in AMX tiles: a build with amx_int8 whose process
// the OS granted the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; a refusal is kept and
// gemm_int8_dot_instruction() then names the vector path).
bool amx_granted();

// Releases this thread's tiles (amx_dot_rows configures them on each call); once after its last call.
void amx_end();

// The rows' terms of each sub-block s of SB = min(G, 32) k that dot_block_rows computes per row: 128 *
// sum(xq) (the int8 codes' correction) and s * float(sum(xq)) (the offsets' factor), [rows, K / SB];
// once per product, for every column block.
struct AmxRowTerms {
  std::vector<int32_t> corrections;
  std::vector<float> scaled_sums;
  int64_t num_subs = 0;
};
AmxRowTerms amx_row_terms(const float* xs, const int32_t* x_sums16, int64_t rows, int64_t K, int64_t group_size);

// `rows` (a multiple of 16) rows of quantized x (xq [rows, K], xs [rows, K / 32], their terms) against
// one column block -> sums [rows, 16] in fp32, bit-identical to gemm_int8_dot.cpp's dot_block_rows: the
// same exact int32 sum per sub-block of min(G, 32) k, the same fp32 rescale in the same order.
// `scratch`: K * 16 bytes (nibbles or 6-bit codes expanded to bytes).
void amx_dot_rows(Codes kind, const int8_t* xq, const float* xs, const AmxRowTerms& terms, int64_t rows, int64_t K,
                  const Weights& w, uint8_t* scratch, float* sums);

// bf16_tiles.cpp. Whether a bf16 x of BF16_TILE_MIN_ROWS rows and more is multiplied through bf16
// tiles: AMX-BF16 on the CPU, a build with amx_int8, the tiles granted (amx_granted()).
bool bf16_tiles_granted();
constexpr int64_t BF16_TILE_MIN_ROWS = 256;  // cpu_isa.py's BF16_TILE_MIN_ROWS

// The weight's column blocks decoded into bf16 chunk by chunk and multiplied by oneDNN's bf16 matmul:
// out [M, out_features] (bf16) = x (bf16 [M, K]) @ W (+ bias, fp32). Only where bf16_tiles_granted().
void gemm_bf16_tiles(Codes kind, const at::Tensor& x, const WeightLayout& layout, int64_t num_blocks, int64_t out_features,
                     const float* bias, at::Tensor& out);

#endif

}  // namespace zserve_int8_dot
