// 16-bit-weight matrix product for the linear layers on every x86-64 CPU with AVX2 + FMA + F16C
// (and AVX-512F, where the build's instruction set has it):
//
//   zserve::gemm_widen(x, w_packed, out_features, bias_f32) -> y
//
//   x         bf16 or fp16 [M, K]    contiguous, the weight's dtype
//   w_packed  same dtype [NB, K, 16] the weight [K, N] in blocks of 16 output columns
//                                    (NB = ceil(N / 16), zero-padded): element (b, k, j) is
//                                    W[k, 16b + j], so one block row is 32 bytes
//   bias_f32  float32 [NB * 16] or None
//   y         x's dtype [M, out_features]
//
// The weights stay 16-bit in memory (half of fp32's bytes: decode reads every weight once per
// step, so that is half the step) and are widened to fp32 in registers: bf16 -> fp32 is a 16-bit
// left shift of the zero-extended value, fp16 -> fp32 one VCVTPH2PS (F16C). Products of two
// 16-bit values are exact in fp32; the sums are fp32 FMAs and are rounded to the output dtype
// once (with the bias added in fp32): what torch.mm does in these dtypes, up to summation order.
//
// Small M (decode, M < TILE_MIN_ROWS): threads split the column blocks; each block streams once,
// in order, widened in registers, for up to MAX_ROWS rows at a time; one row keeps several
// partial sums per column (k split in SPLIT interleaved parts) so FMA latency does not bound it.
// Larger M (prefill, big decode batches): each block is widened once into a per-thread fp32
// scratch (K x 64 bytes, in L2), then rows go through in tiles of TILE_ROWS x 16 columns
// (AVX2: 12 ymm accumulators, 2 weight loads and 6 broadcasts for 12 FMAs per k).
//
// The instruction set is the build's (model_proc/kernels/cpu_isa.py picks -march per ISA): a
// build for avx2 never issues an AVX-512 instruction.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ZSERVE_HAS_GEMM_WIDEN 1
#else
#define ZSERVE_HAS_GEMM_WIDEN 0
#endif

namespace {

constexpr int64_t COLS = 16;           // output columns per packed block
constexpr int MAX_ROWS = 4;            // small M: rows per pass over a block
constexpr int TILE_ROWS = 6;           // large M: rows per register tile
constexpr int64_t TILE_MIN_ROWS = 8;   // from this many rows, widen each block once into scratch

#if ZSERVE_HAS_GEMM_WIDEN

#if defined(__AVX512F__)
using vec = __m512;
constexpr int LANES = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset1(float x) { return _mm512_set1_ps(x); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec widen(const c10::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline vec widen(const c10::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#else
using vec = __m256;
constexpr int LANES = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset1(float x) { return _mm256_set1_ps(x); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec widen(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vec widen(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif
constexpr int NV = COLS / LANES;  // vectors per block row

// One block row (16 values) widened into NV vectors, in the fastest order for the ISA and dtype;
// `in_column_order` puts accumulators made from such vectors back into column order. For bf16
// with AVX2 that is one 32-byte load and two VPUNPCK{L,H}WD with zero (a bf16 is the upper half
// of its fp32), which leaves columns {0-3, 8-11} in the first vector and {4-7, 12-15} in the
// second; a VPERM2F128 pair per block restores the order once the sums are done.
template <typename T>
inline void widen_row(const T* p, vec* w) {
#if !defined(__AVX512F__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    w[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw));
    w[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw));
    return;
  }
#endif
  for (int v = 0; v < NV; ++v) w[v] = widen(p + v * LANES);
}
template <typename T>
inline void in_column_order(vec* acc) {
#if !defined(__AVX512F__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const vec lo = _mm256_permute2f128_ps(acc[0], acc[1], 0x20), hi = _mm256_permute2f128_ps(acc[0], acc[1], 0x31);
    acc[0] = lo;
    acc[1] = hi;
  }
#endif
}

// fp32 sums (+ bias) of `rows` rows x num_cols columns -> the output dtype, rounded once.
template <typename T>
inline void store_rows(const float* sums, int rows, const float* bias, T* out, int64_t out_stride, int64_t num_cols) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < num_cols; ++j) out[r * out_stride + j] = T(sums[r * COLS + j] + (bias != nullptr ? bias[j] : 0.0f));
  }
}

// Small M: ROWS rows of fp32 x against one 16-bit block, widened in registers. With one or two
// rows, SPLIT interleaved partial sums per column keep enough FMAs in flight.
template <typename T, int ROWS>
inline void block_rows(const float* x, int64_t K, const T* w_block, float* sums) {
  constexpr int SPLIT = ROWS == 1 ? 4 : ROWS == 2 ? 2 : 1;
  vec acc[ROWS][SPLIT][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int s = 0; s < SPLIT; ++s)
      for (int v = 0; v < NV; ++v) acc[r][s][v] = vzero();
  int64_t k = 0;
  for (; k + SPLIT <= K; k += SPLIT) {
    for (int s = 0; s < SPLIT; ++s) {
      vec w[NV];
      widen_row(w_block + (k + s) * COLS, w);
      for (int r = 0; r < ROWS; ++r) {
        const vec xb = vset1(x[r * K + k + s]);
        for (int v = 0; v < NV; ++v) acc[r][s][v] = vfma(xb, w[v], acc[r][s][v]);
      }
    }
  }
  for (; k < K; ++k) {
    vec w[NV];
    widen_row(w_block + k * COLS, w);
    for (int r = 0; r < ROWS; ++r) {
      const vec xb = vset1(x[r * K + k]);
      for (int v = 0; v < NV; ++v) acc[r][0][v] = vfma(xb, w[v], acc[r][0][v]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    vec total[NV];
    for (int v = 0; v < NV; ++v) {
      total[v] = acc[r][0][v];
      for (int s = 1; s < SPLIT; ++s) total[v] = vadd(total[v], acc[r][s][v]);
    }
    in_column_order<T>(total);
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, total[v]);
  }
}

// Large M: ROWS rows of fp32 x against one block already widened to fp32 (scratch [K, 16]).
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

template <typename T>
using BlockFn = void (*)(const float*, int64_t, const T*, float*);
template <typename T>
constexpr BlockFn<T> BLOCK_FNS[MAX_ROWS + 1] = {nullptr, block_rows<T, 1>, block_rows<T, 2>, block_rows<T, 3>, block_rows<T, 4>};
using TileFn = void (*)(const float*, int64_t, const float*, float*);
constexpr TileFn TILE_FNS[TILE_ROWS + 1] = {nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>, tile_rows<5>, tile_rows<6>};

// rows of x widened to fp32 with the same instructions as the weights (torch's own bf16 -> fp32
// copy took ~1 ms for 64 x 576 on AVX2: 15% of a batch-64 decode step)
template <typename T>
void widen_rows(const T* x, float* dst, int64_t M, int64_t K) {
  at::parallel_for(0, M, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, K)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const T* src = x + m * K;
      float* out = dst + m * K;
      int64_t k = 0;
      for (; k + LANES <= K; k += LANES) vstore(out + k, widen(src + k));
      for (; k < K; ++k) out[k] = static_cast<float>(src[k]);
    }
  });
}

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features, const float* bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), num_blocks = w_packed.size(0);
  // x widened once to fp32 (M x K: small next to the weights)
  at::Tensor x_f32 = at::empty({M, K}, x.options().dtype(at::kFloat));
  widen_rows(reinterpret_cast<const T*>(x.data_ptr()), x_f32.data_ptr<float>(), M, K);
  const float* xp = x_f32.data_ptr<float>();
  const T* wp = reinterpret_cast<const T*>(w_packed.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());
  if (M < TILE_MIN_ROWS) {
    at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
      alignas(64) float sums[MAX_ROWS * COLS];
      for (int64_t b = b0; b < b1; ++b) {
        const T* w_block = wp + b * K * COLS;
        const int64_t num_cols = std::min(COLS, out_features - b * COLS);
        for (int64_t m = 0; m < M; m += MAX_ROWS) {
          const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - m));
          BLOCK_FNS<T>[rows](xp + m * K, K, w_block, sums);
          store_rows(sums, rows, bias != nullptr ? bias + b * COLS : nullptr, op + m * out_features + b * COLS, out_features, num_cols);
        }
      }
    });
    return;
  }
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scratch(K * COLS);
    alignas(64) float sums[TILE_ROWS * COLS];
    for (int64_t b = b0; b < b1; ++b) {
      const T* w_block = wp + b * K * COLS;
      for (int64_t k = 0; k < K; ++k) {
        vec w[NV];
        widen_row(w_block + k * COLS, w);
        in_column_order<T>(w);
        for (int v = 0; v < NV; ++v) vstore(scratch.data() + k * COLS + v * LANES, w[v]);
      }
      const int64_t num_cols = std::min(COLS, out_features - b * COLS);
      for (int64_t m = 0; m < M; m += TILE_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(TILE_ROWS, M - m));
        TILE_FNS[rows](xp + m * K, K, scratch.data(), sums);
        store_rows(sums, rows, bias != nullptr ? bias + b * COLS : nullptr, op + m * out_features + b * COLS, out_features, num_cols);
      }
    }
  });
}
#endif

bool gemm_widen_supported() { return ZSERVE_HAS_GEMM_WIDEN != 0; }

at::Tensor gemm_widen(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features, const c10::optional<at::Tensor>& bias_f32) {
  TORCH_CHECK(gemm_widen_supported(), "gemm_widen: this build has no AVX2 + FMA + F16C kernel");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kHalf),
              "gemm_widen: x must be contiguous bf16 or fp16 [M, K]");
  TORCH_CHECK(w_packed.dim() == 3 && w_packed.scalar_type() == dtype && w_packed.is_contiguous() && w_packed.size(2) == COLS,
              "gemm_widen: w_packed must be contiguous [NB, K, 16] in x's dtype");
  const int64_t K = x.size(1), num_blocks = w_packed.size(0);
  TORCH_CHECK(w_packed.size(1) == K, "gemm_widen: x has ", K, " columns, the weight ", w_packed.size(1), " rows");
  TORCH_CHECK(out_features > (num_blocks - 1) * COLS && out_features <= num_blocks * COLS, "gemm_widen: out_features does not match the blocks");
  const float* bias = nullptr;
  if (bias_f32.has_value()) {
    TORCH_CHECK(bias_f32->scalar_type() == at::kFloat && bias_f32->is_contiguous() && bias_f32->numel() == num_blocks * COLS,
                "gemm_widen: bias must be contiguous float32 [NB * 16]");
    bias = bias_f32->data_ptr<float>();
  }
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
#if ZSERVE_HAS_GEMM_WIDEN
  if (dtype == at::kBFloat16) {
    run<c10::BFloat16>(x, w_packed, out_features, bias, out);
  } else {
    run<c10::Half>(x, w_packed, out_features, bias, out);
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gemm_widen_supported() -> bool", &gemm_widen_supported);
  m.def("gemm_widen(Tensor x, Tensor w_packed, int out_features, Tensor? bias_f32) -> Tensor", &gemm_widen);
}
