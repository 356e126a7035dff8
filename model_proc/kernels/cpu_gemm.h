// The parts of the block GEMMs shared by gemm_widen.cpp (16-bit weights) and gemm_int8.cpp
// (int8 weights + scales): the vector type of the build's instruction set, x widened to fp32,
// the two drivers over blocks of 16 output columns, and the large-M register tiles.
//
//   streamed_gemm: small M (decode). Threads split the column blocks; each block streams once,
//     in order, through `block(rows, x, b, sums)` (the weight's own function, which widens the
//     weights in registers, around accumulate_rows) for up to MAX_ROWS rows of x at a time.
//   tiled_gemm: larger M. Each block is turned once into an fp32 scratch [K, 16] by
//     `fill(b, scratch)` (per-thread, K x 64 bytes, in L2), then rows go through tile_rows in
//     tiles of TILE_ROWS x 16 columns (AVX2: 12 ymm accumulators, 2 weight loads and 6
//     broadcasts for 12 FMAs per k).
//
// Sums are fp32 and are rounded to the output dtype once, with the bias added in fp32.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ZSERVE_HAS_GEMM_WIDEN 1
#else
#define ZSERVE_HAS_GEMM_WIDEN 0
#endif

namespace zserve_gemm {

constexpr int64_t COLS = 16;          // output columns per packed block
constexpr int MAX_ROWS = 4;           // small M: rows per pass over a block
constexpr int TILE_ROWS = 6;          // large M: rows per register tile
constexpr int64_t TILE_MIN_ROWS = 8;  // from this many rows, turn each block once into scratch

#if ZSERVE_HAS_GEMM_WIDEN

#if defined(__AVX512F__)
using vec = __m512;
constexpr int LANES = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset1(float x) { return _mm512_set1_ps(x); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec widen(const c10::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline vec widen(const c10::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// 16 int8 -> 16 fp32 (exact): VPMOVSXBD + VCVTDQ2PS
inline vec widen(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }
#else
using vec = __m256;
constexpr int LANES = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset1(float x) { return _mm256_set1_ps(x); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec widen(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vec widen(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 int8 -> 8 fp32 (exact): VPMOVSXBD (from a 64-bit load) + VCVTDQ2PS
inline vec widen(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
#endif
inline vec widen(const float* p) { return vload(p); }
constexpr int NV = COLS / LANES;  // vectors per block row

// fp32 sums (+ bias) of `rows` rows x num_cols columns -> the output dtype, rounded once.
template <typename T>
inline void store_rows(const float* sums, int rows, const float* bias, T* out, int64_t out_stride, int64_t num_cols) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < num_cols; ++j) out[r * out_stride + j] = T(sums[r * COLS + j] + (bias != nullptr ? bias[j] : 0.0f));
  }
}

// Large M: ROWS rows of fp32 x against one block already in fp32 (scratch [K, 16]).
template <int ROWS>
inline void tile_rows(const float* x, int64_t K, const float* w_f32, float* sums) {
  vec acc[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    vec w[NV];
    for (int v = 0; v < NV; ++v) w[v] = vload(w_f32 + k * COLS + v * LANES);
    for (int r = 0; r < ROWS; ++r) {
      const vec xb = vset1(x[r * K + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(xb, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, acc[r][v]);
}

// Small M, shared by the weight types: rows [k0, k1) of ROWS rows of x against one block,
// `widen_row(k, w)` giving block row k as NV fp32 vectors, into acc (SPLIT interleaved partial
// sums per column, so that one or two rows keep enough FMAs in flight); `split_total` adds
// a row's partial sums.
// Small M reads each weight once, so the step runs at the memory's pace: a software prefetch
// PREFETCH_BYTES ahead of the stream, once per cache line, lets the widening keep up with it (on
// a 2-core Zen 3 the int8 kernel on a 28 MB matrix went from 0.74 to 0.86 of a read-only
// torch.sum's bandwidth, the demo model's batch-1 int8 step from 15.6 to 14.8 ms).
constexpr int64_t PREFETCH_BYTES = 4096;

template <typename W>
inline void prefetch_ahead(const W* block_row_k, int64_t k) {
  constexpr int64_t rows_per_line = std::max<int64_t>(1, 64 / (COLS * static_cast<int64_t>(sizeof(W))));
  if (k % rows_per_line == 0) _mm_prefetch(reinterpret_cast<const char*>(block_row_k) + PREFETCH_BYTES, _MM_HINT_T0);
}

template <int ROWS>
constexpr int split_of() { return ROWS == 1 ? 4 : ROWS == 2 ? 2 : 1; }

template <int ROWS, typename WidenRow>
inline void accumulate_rows(const float* x, int64_t K, int64_t k0, int64_t k1, WidenRow widen_row, vec (&acc)[ROWS][split_of<ROWS>()][NV]) {
  constexpr int SPLIT = split_of<ROWS>();
  for (int r = 0; r < ROWS; ++r)
    for (int s = 0; s < SPLIT; ++s)
      for (int v = 0; v < NV; ++v) acc[r][s][v] = vzero();
  int64_t k = k0;
  for (; k + SPLIT <= k1; k += SPLIT) {
    for (int s = 0; s < SPLIT; ++s) {
      vec w[NV];
      widen_row(k + s, w);
      for (int r = 0; r < ROWS; ++r) {
        const vec xb = vset1(x[r * K + k + s]);
        for (int v = 0; v < NV; ++v) acc[r][s][v] = vfma(xb, w[v], acc[r][s][v]);
      }
    }
  }
  for (; k < k1; ++k) {
    vec w[NV];
    widen_row(k, w);
    for (int r = 0; r < ROWS; ++r) {
      const vec xb = vset1(x[r * K + k]);
      for (int v = 0; v < NV; ++v) acc[r][0][v] = vfma(xb, w[v], acc[r][0][v]);
    }
  }
}

template <int ROWS>
inline vec split_total(const vec (&acc)[ROWS][split_of<ROWS>()][NV], int r, int v) {
  vec total = acc[r][0][v];
  for (int s = 1; s < split_of<ROWS>(); ++s) total = vadd(total, acc[r][s][v]);
  return total;
}

using TileFn = void (*)(const float*, int64_t, const float*, float*);
constexpr TileFn TILE_FNS[TILE_ROWS + 1] = {nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>, tile_rows<5>, tile_rows<6>};

// Rows of x as fp32: widened with the same instructions as the weights (torch's own bf16 -> fp32
// copy took ~1 ms for 64 x 576 on AVX2: 15% of a batch-64 decode step); fp32 x is used in place.
template <typename T>
const float* x_as_f32(const at::Tensor& x, at::Tensor& holder) {
  if constexpr (std::is_same_v<T, float>) {
    return x.data_ptr<float>();
  } else {
    const int64_t M = x.size(0), K = x.size(1);
    holder = at::empty({M, K}, x.options().dtype(at::kFloat));
    const T* src_all = reinterpret_cast<const T*>(x.data_ptr());
    float* dst_all = holder.data_ptr<float>();
    at::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, K)), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        const T* src = src_all + m * K;
        float* out = dst_all + m * K;
        int64_t k = 0;
        for (; k + LANES <= K; k += LANES) vstore(out + k, widen(src + k));
        for (; k < K; ++k) out[k] = static_cast<float>(src[k]);
      }
    });
    return holder.data_ptr<float>();
  }
}

// Small M: `block(rows, x_rows, b, sums)` writes rows x 16 fp32 sums of block b.
template <typename T, typename BlockFn>
void streamed_gemm(const float* xp, int64_t M, int64_t K, int64_t num_blocks, int64_t out_features, const float* bias, T* op, BlockFn block) {
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float sums[MAX_ROWS * COLS];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t num_cols = std::min(COLS, out_features - b * COLS);
      for (int64_t m = 0; m < M; m += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - m));
        block(rows, xp + m * K, b, sums);
        store_rows(sums, rows, bias != nullptr ? bias + b * COLS : nullptr, op + m * out_features + b * COLS, out_features, num_cols);
      }
    }
  });
}

// Larger M: `fill(b, scratch)` writes block b as fp32 [K, 16] in column order.
template <typename T, typename FillFn>
void tiled_gemm(const float* xp, int64_t M, int64_t K, int64_t num_blocks, int64_t out_features, const float* bias, T* op, FillFn fill) {
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scratch(K * COLS);
    alignas(64) float sums[TILE_ROWS * COLS];
    for (int64_t b = b0; b < b1; ++b) {
      fill(b, scratch.data());
      const int64_t num_cols = std::min(COLS, out_features - b * COLS);
      for (int64_t m = 0; m < M; m += TILE_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(TILE_ROWS, M - m));
        TILE_FNS[rows](xp + m * K, K, scratch.data(), sums);
        store_rows(sums, rows, bias != nullptr ? bias + b * COLS : nullptr, op + m * out_features + b * COLS, out_features, num_cols);
      }
    }
  });
}

#endif  // ZSERVE_HAS_GEMM_WIDEN

// The checks both GEMMs make of the packed blocks and the bias; returns the bias pointer or null.
inline const float* checked_bias(const char* name, const c10::optional<at::Tensor>& bias_f32, int64_t num_blocks) {
  if (!bias_f32.has_value()) return nullptr;
  TORCH_CHECK(bias_f32->scalar_type() == at::kFloat && bias_f32->is_contiguous() && bias_f32->numel() == num_blocks * COLS,
              name, ": bias must be contiguous float32 [NB * 16]");
  return bias_f32->data_ptr<float>();
}

}  // namespace zserve_gemm
