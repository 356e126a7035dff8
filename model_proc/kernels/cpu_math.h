// Small vectorizable helpers shared by the CPU kernels (header-only).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace zserve_cpu {

// exp(x) for x clamped to [-87, 88]: Cody-Waite reduction and a degree-6 polynomial (about 2
// ulp; std::exp would keep an `omp simd` loop scalar). The barrier keeps the two-part reduction
// in its order under -fassociative-math (reassociated, it loses ~3 bits for |x| > 8).
// Always inlined: called out of line, the loops that call it stay scalar.
inline __attribute__((always_inline)) float exp_poly(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  const float r = __builtin_assoc_barrier(xc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

// x rounded to bf16's precision and back to fp32 (round to nearest even), in integer ops that
// vectorize; x is finite.
inline float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float y;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

// n values of T into fp32: a copy for float, a widening for bf16 (16 at a time with AVX-512, 8
// with AVX2: a loop over c10::BFloat16's own conversion stays scalar).
template <typename T>
inline void widen_row(const T* __restrict src, float* __restrict dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
#endif
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// n int8 values times `scale` into fp32 (an int8 KV cache row: one scale per token and head), 16 at
// a time with AVX-512, 8 with AVX2, scalar elsewhere: the same products (an exact int to float
// conversion, one rounded multiply) on every path.
inline void widen_int8_row(const int8_t* __restrict src, float scale, float* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 s16 = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s16));
  }
#endif
#if defined(__AVX2__)
  const __m256 s8 = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s8));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
}

// An fp8 KV cache's bytes (--kv-cache-dtype fp8_e4m3 / fp8_e5m2, scale 1.0) as the fp16 bits of the same value
// (e5m2), or of the value times 2^-8 (e4m3): e5m2 is fp16's top byte (sign, 5 exponent bits of the same bias, 2
// mantissa bits), so the byte shifted left by 8 is that fp16; e4m3's 4 exponent bits (bias 7) and 3 mantissa bits,
// shifted left by 7 under fp16's 5-bit exponent (bias 15), make an fp16 of the value times 2^(7 - 15), subnormals
// included (both formats' subnormals sit at the bottom of their exponent range), with the sign moved to bit 15.
template <typename Fp8>
inline uint16_t fp8_as_half_bits(uint8_t b) {
  if constexpr (std::is_same_v<Fp8, c10::Float8_e5m2>) {
    return static_cast<uint16_t>(b << 8);
  } else {
    static_assert(std::is_same_v<Fp8, c10::Float8_e4m3fn>);
    return static_cast<uint16_t>(((b & 0x7F) << 7) | ((b & 0x80) << 8));
  }
}

// 2^8 for e4m3 (undoes fp8_as_half_bits' 2^-8; exact), 1 for e5m2
template <typename Fp8>
constexpr float FP8_HALF_SCALE = std::is_same_v<Fp8, c10::Float8_e4m3fn> ? 256.0f : 1.0f;

#if defined(__AVX512F__)
// 16 fp8 values at `src` as fp32 in a register: the fp16 of fp8_as_half_bits widened by VCVTPH2PS, so e4m3 comes out
// times 2^-8 (FP8_HALF_SCALE undoes it: the caller multiplies, or folds 2^8 into what it multiplies by). e4m3's fp16
// bits from the byte sign-extended to 16 bits: shifted left by 7, bit 15 holds the sign, bits 13..7 the exponent and
// mantissa, and bit 14 (the sign's copy, fp16's top exponent bit) is cleared.
template <typename Fp8>
inline __m512 widen_fp8_16_unscaled(const uint8_t* src) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  if constexpr (std::is_same_v<Fp8, c10::Float8_e4m3fn>) {
    const __m256i shifted = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(shifted, _mm256_set1_epi16(static_cast<int16_t>(0xBFFF))));
  } else {
    static_assert(std::is_same_v<Fp8, c10::Float8_e5m2>);
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8));
  }
}
#endif

// n fp8 values into fp32 (an fp8 KV cache row): the bytes as fp16 (fp8_as_half_bits) widened by VCVTPH2PS, 16
// at a time with AVX-512, 8 with AVX2 + F16C, scalar through c10's fp16 conversion elsewhere; e4m3 then times 2^8.
// Every step is exact, so each path gives torch's fp8 -> fp32 value for every byte the writers store (e4m3's NaN
// byte, S.1111.111, never written, reads as +-480 here).
template <typename Fp8>
inline void widen_fp8_row(const Fp8* __restrict src_fp8, float* __restrict dst, int64_t n) {
  static_assert(sizeof(Fp8) == 1);
  const uint8_t* __restrict src = reinterpret_cast<const uint8_t*>(src_fp8);
  constexpr bool e4m3 = std::is_same_v<Fp8, c10::Float8_e4m3fn>;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 scale16 = _mm512_set1_ps(FP8_HALF_SCALE<Fp8>);
  for (; i + 16 <= n; i += 16) {
    const __m512 unscaled = widen_fp8_16_unscaled<Fp8>(src + i);
    _mm512_storeu_ps(dst + i, e4m3 ? _mm512_mul_ps(unscaled, scale16) : unscaled);
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  const __m256 scale8 = _mm256_set1_ps(FP8_HALF_SCALE<Fp8>);
  for (; i + 8 <= n; i += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
    if constexpr (e4m3) {  // as widen_fp8_16_unscaled
      const __m128i shifted = _mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7);
      const __m128i half = _mm_and_si128(shifted, _mm_set1_epi16(static_cast<int16_t>(0xBFFF)));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(half), scale8));
    } else {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8)));
    }
  }
#endif
  for (; i < n; ++i) {
    dst[i] = c10::detail::fp16_ieee_to_fp32_value(fp8_as_half_bits<Fp8>(src[i])) * FP8_HALF_SCALE<Fp8>;
  }
}

// n fp32 values into fp8 (an fp8 KV cache row, scale 1.0): each clamped to the format's finite range (448 for e4m3,
// 57344 for e5m2; infinities too), then c10's conversion, to nearest even, as kv_fp8.py's to_fp8 (torch's) does.
// NaN stays NaN.
template <typename Fp8>
inline void narrow_fp8_row(const float* __restrict src, Fp8* __restrict dst, int64_t n) {
  const float finite = static_cast<float>(std::numeric_limits<Fp8>::max());
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp8(std::min(std::max(src[i], -finite), finite));
}

// max |x| over n fp32 values (0 for none)
inline float abs_max(const float* __restrict src, int64_t n) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(src[i]));
  return amax;
}

// n fp32 values into int8 with one symmetric fp32 scale, returned (the int8 decode walk's query rows): scale =
// max|x| / 127, q = round(x / scale) to nearest even (x * (127 / max|x|), as testing/int8_attention_reference.py's
// quantize_query_row computes it); all zeros give scale 0.
inline float quantize_int8_row(const float* __restrict src, int8_t* __restrict dst, int64_t n) {
  const float amax = abs_max(src, n);
  // the barrier keeps x * inv a product of x and the rounded 127 / amax under -fassociative-math (as
  // (x * 127) / amax it rounds differently, and a tie at 63.5 lands on the other side of torch's)
  const float inv = amax > 0.0f ? __builtin_assoc_barrier(127.0f / amax) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, __builtin_rintf(src[i] * inv))));
  }
  return amax / 127.0f;
}

// An int8 KV cache row (--kv-cache-dtype int8): the same with its scale kept in bf16, 2 bytes a row instead of 4:
// s = bf16(max|x| / 127) (to nearest even), q = round(x * (1 / s)) to nearest even, clamped to +-127 (s may round
// below max|x| / 127 by 2^-9 of it: the row's largest value then rounds to 127 all the same). kv_int8.py's
// quantize_rows computes the same fp32 operations, so both writers store the same bytes.
inline c10::BFloat16 quantize_int8_row_bf16_scale(const float* __restrict src, int8_t* __restrict dst, int64_t n) {
  const c10::BFloat16 scale(__builtin_assoc_barrier(abs_max(src, n) / 127.0f));
  const float s = static_cast<float>(scale);
  const float inv = s > 0.0f ? __builtin_assoc_barrier(1.0f / s) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, __builtin_rintf(src[i] * inv))));
  }
  return scale;
}

// n fp32 values into bf16, rounded to nearest even (NaN stays a quiet NaN), as c10::BFloat16(x):
// VCVTNEPS2BF16 with AVX512-BF16, the same rounding in integer ops with AVX2.
inline void narrow_row(const float* __restrict src, c10::BFloat16* __restrict dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  }
#endif
#if defined(__AVX2__)
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), nan = _mm256_set1_epi32(0x7FC0);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, half), lsb), 16);
    rounded = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    // 8 x u32 (each <= 0xFFFF) -> 8 x u16: pack within each 128-bit lane, then join the lanes
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = c10::BFloat16(src[i]);
}

}  // namespace zserve_cpu
