// What paged_attention.cpp's decode walk over an int8 KV cache multiplies with, where the CPU has
// AVX512-VNNI (ZSERVE_INT8_DECODE): a query row quantized to int8 once, its scores against 16 keys at
// a time as exact int32 dot products (VPDPBUSD), and the values' weighted sums from int8 rows.
//
// Scores. A query row qf (fp32, pre-scaled) is stored as codes c = round(qf / sq), sq = max|qf| / 127
// (cpu_math.h's quantize_int8_row, the cache's own rounding); key j as codes k_j and scale sk_j. Then
//
//     score_j = float(sum_x c[x] * k_j[x]) * (sq * sk_j)
//
// the integer sum exact. VPDPBUSD multiplies unsigned bytes by signed ones, four to a 32-bit lane: the
// keys enter as unsigned k + 128 (a xor of the sign bit) and the query's codes as the signed side,
// so each lane sums (k + 128) * c and the row's constant 128 * sum(c) comes off. Sixteen keys' rows
// are transposed as 4-byte groups, so lane i of every product is key i's and one zmm ends holding the
// 16 keys' sums: no horizontal reduction. As llama.cpp's CPU attention does over a q8_0 cache (the
// query converted to the keys' dot-product type), the query is rounded to int8: its error adds to
// the cache's (tests/model/test_attention_kernel_int8.py checks both against a reference of this
// arithmetic and against the unquantized cache).
//
// Values. Row j's int8 codes widen to fp32 in registers and are weighted by p_j * sv_j (the softmax
// probability times the row's scale), a few query rows at a time so their accumulators stay in
// registers while the value row is widened once.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ZSERVE_INT8_DECODE 1
#include <immintrin.h>

namespace zserve_int8_attention {

constexpr int64_t KEYS = 16;  // keys per score block: one zmm of int32 sums

// The 16 rows of `keys` (D int8 each; D a multiple of 64) as D / 4 vectors, t[g] lane i = bytes 4g..4g+3
// of key i, each byte + 128 (unsigned). A 16 x 16 transpose of 32-bit groups per 64 bytes: within
// 128-bit lanes by unpacks, then across them by two rounds of 128-bit shuffles.
template <int64_t D>
inline void transpose_keys(const int8_t* const* keys, __m512i* t) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t chunk = 0; chunk < D / 64; ++chunk) {
    __m512i r[16], u[16], b[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_xor_si512(_mm512_loadu_si512(keys[i] + 64 * chunk), sign);
    for (int i = 0; i < 8; ++i) {  // u[2i] lane L: keys 2i, 2i+1's groups 4L, 4L+1; u[2i+1]: 4L+2, 4L+3
      u[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      u[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // b[4i + m] lane L: keys 4i..4i+3's group 4L + m
      b[4 * i] = _mm512_unpacklo_epi64(u[4 * i], u[4 * i + 2]);
      b[4 * i + 1] = _mm512_unpackhi_epi64(u[4 * i], u[4 * i + 2]);
      b[4 * i + 2] = _mm512_unpacklo_epi64(u[4 * i + 1], u[4 * i + 3]);
      b[4 * i + 3] = _mm512_unpackhi_epi64(u[4 * i + 1], u[4 * i + 3]);
    }
    __m512i* out = t + 16 * chunk;
    for (int m = 0; m < 4; ++m) {  // group 4L + m: lane L of b[m], b[4 + m], b[8 + m], b[12 + m], in that order
      const __m512i even01 = _mm512_shuffle_i32x4(b[m], b[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
      const __m512i odd01 = _mm512_shuffle_i32x4(b[m], b[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
      const __m512i even23 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
      const __m512i odd23 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
      out[m] = _mm512_shuffle_i32x4(even01, even23, _MM_SHUFFLE(2, 0, 2, 0));       // L = 0
      out[4 + m] = _mm512_shuffle_i32x4(odd01, odd23, _MM_SHUFFLE(2, 0, 2, 0));     // L = 1
      out[8 + m] = _mm512_shuffle_i32x4(even01, even23, _MM_SHUFFLE(3, 1, 3, 1));   // L = 2
      out[12 + m] = _mm512_shuffle_i32x4(odd01, odd23, _MM_SHUFFLE(3, 1, 3, 1));    // L = 3
    }
  }
}

// Lane i = sum_x codes[x] * key_i[x] + 128 * sum(codes), for the keys `t` holds (transpose_keys).
// Four partial sums keep the VPDPBUSD chain short.
template <int64_t D>
inline __m512i dot_keys(const __m512i* t, const int8_t* codes) {
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int64_t g = 0; g < D / 4; ++g) {
    int32_t group;
    __builtin_memcpy(&group, codes + 4 * g, 4);
    acc[g % 4] = _mm512_dpbusd_epi32(acc[g % 4], t[g], _mm512_set1_epi32(group));
  }
  return _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
}

// acc[b] (fp32 [D], b < RB) = acc[b] * alpha[b] + sum_{lo <= j < hi} w[b][j] * values[j], w[b] = weights + b * stride,
// values int8 [D] widened in registers (their scales are in the weights). Each value row is widened once
// for the RB rows; D / 16 * RB accumulators stay in registers (RB <= 4 at D = 64, <= 3 at D = 128).
template <int64_t D, int RB>
inline void add_values(const int8_t* const* values, const float* weights, int64_t stride, int64_t lo, int64_t hi,
                       const float* alpha, float* acc) {
  constexpr int64_t C = D / 16;
  __m512 r[RB][C];
  for (int b = 0; b < RB; ++b) {
    const __m512 a = _mm512_set1_ps(alpha[b]);
    for (int64_t c = 0; c < C; ++c) r[b][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + b * D + 16 * c), a);
  }
  for (int64_t j = lo; j < hi; ++j) {
    __m512 w[RB];
    for (int b = 0; b < RB; ++b) w[b] = _mm512_set1_ps(weights[b * stride + j]);
    for (int64_t c = 0; c < C; ++c) {
      const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values[j] + 16 * c))));
      for (int b = 0; b < RB; ++b) r[b][c] = _mm512_fmadd_ps(w[b], v, r[b][c]);
    }
  }
  for (int b = 0; b < RB; ++b)
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(acc + b * D + 16 * c, r[b][c]);
}

}  // namespace zserve_int8_attention

#endif
