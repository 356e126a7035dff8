// What paged_attention.cpp's decode walk over an fp8 KV cache scores with where the build has AVX512-BF16 (and
// AVX512-VNNI's transposition, int8_attention.h) and the queries are bf16: 16 keys at a time straight from their
// bytes, as bf16 pairs multiplied by VDPBF16PS, without widening the keys to fp32 or summing each key's lanes.
//
// Every fp8 value (e4m3 and e5m2, subnormals included) is a normal bf16, so the keys' bytes convert exactly: a
// normal e4m3 byte s.eeee.mmm is the bf16 s.(e + 120).mmm0000 (e5m2 s.eeeee.mm: s.(e + 112).mm00000); its high byte is
// s | (60 + e / 2) (e5m2: 56 + e / 2), its low byte (e & 1) << 7 | m << 4, the byte's low nibble shifted left 4 (e5m2:
// the low 3 bits shifted left 5); bytes with e = 0 (zero, subnormals) are looked up (VPSHUFB) instead. e4m3's NaN byte,
// never written, reads as +-480 (as cpu_math.h's widen_fp8_row). Sixteen keys' rows are transposed in 4-byte groups
// (int8_attention.h's transpose_keys); each group's bytes become bf16, interleaved into two vectors of pairs (dims
// 4g, 4g + 1 and 4g + 2, 4g + 3 of keys 4l, 4l + 1, then of keys 4l + 2, 4l + 3 in 128-bit lane l), and VDPBF16PS
// adds q's matching pairs (one 64-bit broadcast) into each lane: one key's sum ends in two adjacent lanes, added once
// per 16 keys. The query rows are the model's bf16 values; the score is that sum (fp32, VDPBF16PS's rounding and
// order) times the softmax scale. Against attend()'s (q * scale) . k in fp32 the sums differ in rounding only:
// tests/model/test_attention_kernel_fp8.py holds them bit for bit where every product and sum is exact (integer-valued
// rows) and within a bf16 rounding of the output elsewhere.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "int8_attention.h"

#if ZSERVE_INT8_DECODE_VNNI && defined(__AVX512BF16__)
#define ZSERVE_FP8_DECODE_BF16 1

namespace zserve_fp8_attention {

constexpr int64_t KEYS = 16;  // keys per score block

// 64 fp8 bytes as the high and low bytes of their bf16 values (exact).
template <typename Fp8>
inline void to_bf16_bytes(__m512i bytes, __m512i& hi, __m512i& lo) {
  const __m512i magnitude = _mm512_and_si512(bytes, _mm512_set1_epi8(0x7F));  // VPSHUFB's index (bit 7 would zero it)
  __mmask64 low_exponent;
  __m512i hi_table, lo_table;  // by magnitude, for the bytes whose exponent field is 0
  if constexpr (std::is_same_v<Fp8, c10::Float8_e4m3fn>) {
    hi = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), _mm512_set1_epi8(0x07)), _mm512_set1_epi8(60));
    lo = _mm512_and_si512(_mm512_slli_epi16(bytes, 4), _mm512_set1_epi8(static_cast<char>(0xF0)));
    low_exponent = _mm512_testn_epi8_mask(bytes, _mm512_set1_epi8(0x78));
    // m * 2^-9: 0, 2^-9, 2^-8, 1.5 * 2^-8, 2^-7, 1.25 * 2^-7, 1.5 * 2^-7, 1.75 * 2^-7
    hi_table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 59, 59, 59, 60, 60, 60, 60, 0, 0, 0, 0, 0, 0, 0, 0));
    lo_table = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 0, static_cast<char>(0x80), static_cast<char>(0xC0), 0, 0x20, 0x40, 0x60, 0, 0, 0, 0, 0, 0, 0, 0));
  } else {
    static_assert(std::is_same_v<Fp8, c10::Float8_e5m2>);
    hi = _mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 3), _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(56));
    lo = _mm512_and_si512(_mm512_slli_epi16(bytes, 5), _mm512_set1_epi8(static_cast<char>(0xE0)));
    low_exponent = _mm512_testn_epi8_mask(bytes, _mm512_set1_epi8(0x7C));
    // m * 2^-16: 0, 2^-16, 2^-15, 1.5 * 2^-15
    hi_table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 55, 56, 56, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    lo_table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, static_cast<char>(0x80), 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  }
  hi = _mm512_mask_shuffle_epi8(hi, low_exponent, hi_table, magnitude);
  lo = _mm512_mask_shuffle_epi8(lo, low_exponent, lo_table, magnitude);
  hi = _mm512_ternarylogic_epi32(hi, bytes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (bytes & 0x80)
}

// scores[r * stride + i] = scale * (q_r . key i) for the 16 keys `keys` (D fp8 bytes each) and query rows r < rows
// (bf16 [D], row r at q + r * q_stride).
template <typename Fp8, int64_t D>
inline void score_block(const uint8_t* const* keys, const c10::BFloat16* q, int64_t q_stride, int64_t rows, float scale,
                        float* scores, int64_t stride) {
  __m512i t[D / 4];
  zserve_int8_attention::transpose_keys<D, false>(reinterpret_cast<const int8_t* const*>(keys), t);
  __m512i pairs[D / 2];  // group g: [2g] keys 4l, 4l + 1 of lane l, [2g + 1] keys 4l + 2, 4l + 3
  for (int64_t g = 0; g < D / 4; ++g) {
    __m512i hi, lo;
    to_bf16_bytes<Fp8>(t[g], hi, lo);
    pairs[2 * g] = _mm512_unpacklo_epi8(lo, hi);
    pairs[2 * g + 1] = _mm512_unpackhi_epi8(lo, hi);
  }
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const c10::BFloat16* qr = q + r * q_stride;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t g = 0; g < D / 4; ++g) {  // two chains a side: VDPBF16PS's latency
      int64_t four;
      std::memcpy(&four, qr + 4 * g, sizeof(four));
      const __m512bh qv = (__m512bh)_mm512_set1_epi64(four);
      const int64_t c = 2 * (g & 1);
      acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)pairs[2 * g], qv);
      acc[c + 1] = _mm512_dpbf16_ps(acc[c + 1], (__m512bh)pairs[2 * g + 1], qv);
    }
    const __m512 a = _mm512_add_ps(acc[0], acc[2]), b = _mm512_add_ps(acc[1], acc[3]);
    // lane l: [a0 + a1, a2 + a3, b0 + b1, b2 + b3] = keys 4l .. 4l + 3
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(scores + r * stride, _mm512_mul_ps(sums, scale_v));
  }
}

}  // namespace zserve_fp8_attention

#endif
