// Small vectorizable helpers shared by the CPU kernels (header-only).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace zserve_cpu {

// exp(x) for x clamped to [-87, 88]: Cody-Waite reduction and a degree-6 polynomial (about 2
// ulp; std::exp would keep an `omp simd` loop scalar). The barrier keeps the two-part reduction
// in its order under -fassociative-math (reassociated, it loses ~3 bits for |x| > 8).
inline float exp_poly(float x) {
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

// n values of T into fp32: a copy for float, a widening for bf16 (16 at a time with AVX-512:
// a loop over c10::BFloat16's own conversion stays scalar).
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
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

}  // namespace zserve_cpu
