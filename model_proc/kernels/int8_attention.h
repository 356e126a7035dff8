// What paged_attention.cpp's decode walk over an int8 KV cache multiplies with (ZSERVE_INT8_DECODE:
// builds with AVX512-VNNI, or with AVX2): a query row quantized to int8 once, its scores against 16
// keys at a time as exact int32 dot products (VPDPBUSD; with AVX2 VPMADDUBSW + VPMADDWD), and the
// values' weighted sums from int8 rows.
//
// Scores. A query row qf (fp32, pre-scaled) is stored as codes c = round(qf / sq), sq = max|qf| / 127
// (cpu_math.h's quantize_int8_row: the cache's rounding, sq kept in fp32); key j as codes k_j and scale sk_j. Then
//
//     score_j = float(sum_x c[x] * k_j[x]) * (sq * sk_j)
//
// the integer sum exact. VPDPBUSD multiplies unsigned bytes by signed ones, four to a 32-bit lane: the
// keys enter as unsigned k + 128 (a xor of the sign bit) and the query's codes as the signed side,
// so each lane sums (k + 128) * c and the row's constant 128 * sum(c) comes off. Sixteen keys' rows
// are transposed as 4-byte groups, so lane i of every product is key i's and one zmm ends holding the
// 16 keys' sums: no horizontal reduction. AVX2 has no VPDPBUSD: VPMADDUBSW multiplies |c| (unsigned)
// by k with c's sign moved onto it (VPSIGNB) into 16-bit pairs (|sum| <= 2 * 127 * 127: no
// saturation) and VPMADDWD adds the pairs into 32 bits; eight keys per ymm, the same exact sums. As llama.cpp's CPU attention does over a q8_0 cache (the
// query converted to the keys' dot-product type), the query is rounded to int8: its error adds to
// the cache's (tests/model/test_attention_kernel_int8.py checks both against a reference of this
// arithmetic and against the unquantized cache).
//
// Values. Row j's int8 codes widen to fp32 and are weighted by p_j * sv_j (the softmax probability
// times the row's scale): with AVX-512 in registers, a few query rows at a time so their accumulators
// stay in registers while the value row is widened once; with AVX2 (16 registers) the tile's rows are
// widened once into a buffer that each query row then reads.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ZSERVE_INT8_DECODE 1
#define ZSERVE_INT8_DECODE_VNNI 1
#elif defined(__AVX2__) && !defined(__AVX512F__)
#define ZSERVE_INT8_DECODE 1
#endif

#if ZSERVE_INT8_DECODE
#include <immintrin.h>

#include <algorithm>

namespace zserve_int8_attention {

constexpr int64_t KEYS = 16;  // keys per score block
constexpr int64_t TILE = 64;  // keys per tile (paged_attention.cpp's KEY_TILE): the weights' row stride

// The rows' int8 codes (c [rows, D]) and what each row's sums need: sq, and 128 * sum(c) (VPDPBUSD's offset).
struct QueryCodes {
  const int8_t* codes;
  const float* scales;
  const int32_t* corrections;
  int64_t rows;
};

// The largest of x[0, n), n <= TILE (a row's scores in a tile), 16 lanes at a time (a scalar loop is a
// chain of dependent max instructions: a fifth of the walk's time).
inline float max_of(const float* x, int64_t n) {
  alignas(64) float padded[TILE];
  std::fill(padded, padded + TILE, -3.0e38f);
  std::copy(x, x + n, padded);
#if ZSERVE_INT8_DECODE_VNNI
  __m512 best = _mm512_max_ps(_mm512_load_ps(padded), _mm512_load_ps(padded + 16));
  best = _mm512_max_ps(best, _mm512_max_ps(_mm512_load_ps(padded + 32), _mm512_load_ps(padded + 48)));
  return _mm512_reduce_max_ps(best);
#else
  __m256 best = _mm256_load_ps(padded);
  for (int64_t i = 8; i < TILE; i += 8) best = _mm256_max_ps(best, _mm256_load_ps(padded + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  return *std::max_element(lanes, lanes + 8);
#endif
}

#if ZSERVE_INT8_DECODE_VNNI

// The 16 rows of `keys` (D bytes each; D a multiple of 64) as D / 4 vectors, t[g] lane i = bytes 4g..4g+3
// of key i, with OFFSET each byte + 128 (int8 codes as unsigned). A 16 x 16 transpose of 32-bit groups per 64
// bytes: within 128-bit lanes by unpacks, then across them by two rounds of 128-bit shuffles.
template <int64_t D, bool OFFSET = true>
inline void transpose_keys(const int8_t* const* keys, __m512i* t) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t chunk = 0; chunk < D / 64; ++chunk) {
    __m512i r[16], u[16], b[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = _mm512_loadu_si512(keys[i] + 64 * chunk);
      if constexpr (OFFSET) r[i] = _mm512_xor_si512(r[i], sign);
    }
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

// scores[g * TILE + i] = key i's score for row g, the 16 keys `keys` (scales `key_scales`).
template <int64_t D>
inline void score_block(const int8_t* const* keys, const float* key_scales, const QueryCodes& q, float* scores) {
  __m512i t[D / 4];
  transpose_keys<D>(keys, t);
  const __m512 ks = _mm512_loadu_ps(key_scales);
  for (int64_t g = 0; g < q.rows; ++g) {
    const __m512i sums = _mm512_sub_epi32(dot_keys<D>(t, q.codes + g * D), _mm512_set1_epi32(q.corrections[g]));
    _mm512_storeu_ps(scores + g * TILE, _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(_mm512_set1_ps(q.scales[g]), ks)));
  }
}

// acc[g] = acc[g] * alpha[g] + sum_{j < n} weights[g * TILE + j] * values[j] for every row g, a few rows at a
// time (4 at D = 64, 3 at D = 128). `buffer` is unused here (AVX2's widened tile).
template <int64_t D>
inline void add_values_rows(const int8_t* const* values, const float* weights, int64_t n, const float* alpha, float* acc,
                            int64_t rows, float* /*buffer*/) {
  constexpr int64_t RB = D == 64 ? 4 : 3;
  for (int64_t b = 0; b < rows; b += RB) {
    const int64_t num = std::min<int64_t>(RB, rows - b);
    const float* w = weights + b * TILE;
    if (num == 4) {
      add_values<D, 4>(values, w, TILE, 0, n, alpha + b, acc + b * D);
    } else if (num == 3) {
      add_values<D, 3>(values, w, TILE, 0, n, alpha + b, acc + b * D);
    } else if (num == 2) {
      add_values<D, 2>(values, w, TILE, 0, n, alpha + b, acc + b * D);
    } else {
      add_values<D, 1>(values, w, TILE, 0, n, alpha + b, acc + b * D);
    }
  }
}

#else  // AVX2

// The 8 rows `keys` (D int8 each) as D / 4 ymm, t[g] lane i = bytes 4g..4g+3 of key i: an 8 x 8 transpose
// of 32-bit groups per 32 bytes (unpacks within 128-bit lanes, then a swap of lanes).
template <int64_t D>
inline void transpose_keys8(const int8_t* const* keys, __m256i* t) {
  for (int64_t chunk = 0; chunk < D / 32; ++chunk) {
    __m256i r[8], u[8], b[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys[i] + 32 * chunk));
    for (int i = 0; i < 4; ++i) {  // u[2i] lane L: keys 2i, 2i+1's groups 4L, 4L+1; u[2i+1]: 4L+2, 4L+3
      u[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      u[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // b[4i + m] lane L: keys 4i..4i+3's group 4L + m
      b[4 * i] = _mm256_unpacklo_epi64(u[4 * i], u[4 * i + 2]);
      b[4 * i + 1] = _mm256_unpackhi_epi64(u[4 * i], u[4 * i + 2]);
      b[4 * i + 2] = _mm256_unpacklo_epi64(u[4 * i + 1], u[4 * i + 3]);
      b[4 * i + 3] = _mm256_unpackhi_epi64(u[4 * i + 1], u[4 * i + 3]);
    }
    __m256i* out = t + 8 * chunk;
    for (int m = 0; m < 4; ++m) {  // group m: lane 0 of b[m] and b[4 + m]; group 4 + m: their lane 1
      out[m] = _mm256_permute2x128_si256(b[m], b[4 + m], 0x20);
      out[4 + m] = _mm256_permute2x128_si256(b[m], b[4 + m], 0x31);
    }
  }
}

// Lane i = sum_x codes[x] * key_i[x] (exact) for the 8 keys `t` holds; `magnitudes` = |codes|.
template <int64_t D>
inline __m256i dot_keys8(const __m256i* t, const int8_t* codes, const int8_t* magnitudes) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int64_t g = 0; g < D / 4; ++g) {
    int32_t group, magnitude;
    __builtin_memcpy(&group, codes + 4 * g, 4);
    __builtin_memcpy(&magnitude, magnitudes + 4 * g, 4);
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(magnitude), _mm256_sign_epi8(t[g], _mm256_set1_epi32(group)));
    acc[g % 2] = _mm256_add_epi32(acc[g % 2], _mm256_madd_epi16(pairs, ones));
  }
  return _mm256_add_epi32(acc[0], acc[1]);
}

// As the AVX-512 score_block; q.corrections unused, the codes' magnitudes follow the codes ([rows, D] after them).
template <int64_t D>
inline void score_block(const int8_t* const* keys, const float* key_scales, const QueryCodes& q, float* scores) {
  __m256i t[D / 4];
  const int8_t* magnitudes = q.codes + q.rows * D;
  for (int64_t half = 0; half < 2; ++half) {
    transpose_keys8<D>(keys + 8 * half, t);
    const __m256 ks = _mm256_loadu_ps(key_scales + 8 * half);
    for (int64_t g = 0; g < q.rows; ++g) {
      const __m256i sums = dot_keys8<D>(t, q.codes + g * D, magnitudes + g * D);
      _mm256_storeu_ps(scores + g * TILE + 8 * half,
                       _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_set1_ps(q.scales[g]), ks)));
    }
  }
}

// As the AVX-512 add_values_rows: the n value rows widened once into `buffer` (fp32 [TILE, D]), then each
// row's accumulator, 64 columns at a time (8 ymm), over them.
template <int64_t D>
inline void add_values_rows(const int8_t* const* values, const float* weights, int64_t n, const float* alpha, float* acc,
                            int64_t rows, float* buffer) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t x = 0; x < D; x += 8) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(values[j] + x));
      _mm256_storeu_ps(buffer + j * D + x, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
    }
  }
  for (int64_t g = 0; g < rows; ++g) {
    const __m256 a = _mm256_set1_ps(alpha[g]);
    for (int64_t col = 0; col < D; col += 64) {
      float* ar = acc + g * D + col;
      __m256 r[8];
      for (int c = 0; c < 8; ++c) r[c] = _mm256_mul_ps(_mm256_loadu_ps(ar + 8 * c), a);
      for (int64_t j = 0; j < n; ++j) {
        const __m256 w = _mm256_set1_ps(weights[g * TILE + j]);
        for (int c = 0; c < 8; ++c) r[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(buffer + j * D + col + 8 * c), r[c]);
      }
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(ar + 8 * c, r[c]);
    }
  }
}

#endif

}  // namespace zserve_int8_attention

#endif
