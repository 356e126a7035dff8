// bf16 matrix product for the linear layers on CPUs with AVX512-BF16:
//
//   zserve::gemm_bf16(x, w_packed, out_features, bias_f32) -> y
//
//   x         bf16 [M, K]            contiguous, K even
//   w_packed  int32 [NB, K / 2, 16]  the weight [K, N] in blocks of 16 output columns
//                                    (NB = ceil(N / 16), zero-padded): element (b, p, j) holds
//                                    the bf16 pair (W[2p, 16b + j], W[2p + 1, 16b + j])
//   bias_f32  float32 [NB * 16] or None
//   y         bf16 [M, out_features]
//
// For each block of 16 columns, rows of x go through in groups of up to 8: per pair of k, one
// 64-byte load of the weight block feeds one VDPBF16PS per row (16 columns x 2 products,
// accumulated in fp32), so a decode step streams each weight exactly once, in order, and a
// block (K x 32 bytes) stays in L1 while larger batches reuse it. Threads split the column
// blocks. Sums are fp32 in k order and rounded to bf16 once (with the bias added in fp32),
// which is what oneDNN does for torch.mm in bf16 at these sizes.
//
// `gemm_bf16_supported()` says whether this build has the kernel: it needs AVX512-BF16 at
// compile time (a feature set with avx512_bf16: -march=x86-64-v4 -mavx512bf16, cpu_isa.py; it
// needs no VNNI); elsewhere the op refuses and Python keeps oneDNN.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define ZSERVE_HAS_GEMM_BF16 1
#else
#define ZSERVE_HAS_GEMM_BF16 0
#endif

namespace {

constexpr int64_t COLS = 16;      // output columns per block: one zmm of fp32 sums
constexpr int64_t MAX_ROWS = 8;   // rows of x per pass over a block
constexpr int TILE_BLOCKS = 4;    // larger batches: column blocks per tile
constexpr int TILE_ROWS = 6;      // and rows per tile
constexpr int64_t TILE_MIN_ROWS = 16;  // batches from this many rows use tiles

#if ZSERVE_HAS_GEMM_BF16
template <int ROWS>
inline void block_rows(const uint16_t* x, int64_t K, const int32_t* w_block, int64_t num_pairs, uint16_t* out,
                       int64_t out_stride, const float* bias, int64_t num_cols) {
  __m512 acc[ROWS];
  const int32_t* x_pairs[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    acc[i] = _mm512_setzero_ps();
    x_pairs[i] = reinterpret_cast<const int32_t*>(x + i * K);
  }
  for (int64_t p = 0; p < num_pairs; ++p) {
    const __m512i w = _mm512_loadu_si512(w_block + p * COLS);
    for (int i = 0; i < ROWS; ++i) {
      const __m512i xx = _mm512_set1_epi32(x_pairs[i][p]);
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)xx, (__m512bh)w);
    }
  }
  const __mmask16 mask = num_cols >= COLS ? 0xFFFF : static_cast<__mmask16>((1u << num_cols) - 1);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int i = 0; i < ROWS; ++i) {
    const __m256bh y = _mm512_cvtneps_pbh(_mm512_add_ps(acc[i], b));
    _mm256_mask_storeu_epi16(out + i * out_stride, mask, (__m256i)y);
  }
}

// Larger batches: 4 column blocks x TILE_ROWS rows at a time (24 accumulators), so each pair of
// k loads 4 weight vectors and TILE_ROWS broadcasts for 4 x TILE_ROWS VDPBF16PS: 10 loads per
// 24 products instead of 9 per 8. Measured on SmolLM2-135M's layer shapes (same process,
// alternating): 0.81-0.93x the time of the one-block loop at 16 to 2048 rows.
template <int ROWS>
inline void tile_rows(const uint16_t* x, int64_t K, const int32_t* w_blocks, int64_t block_stride, int64_t num_pairs,
                      uint16_t* out, int64_t out_stride, const float* bias) {
  __m512 acc[ROWS][TILE_BLOCKS];
  const int32_t* x_pairs[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    x_pairs[r] = reinterpret_cast<const int32_t*>(x + r * K);
    for (int c = 0; c < TILE_BLOCKS; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < num_pairs; ++p) {
    __m512i w[TILE_BLOCKS];
    for (int c = 0; c < TILE_BLOCKS; ++c) w[c] = _mm512_loadu_si512(w_blocks + c * block_stride + p * COLS);
    for (int r = 0; r < ROWS; ++r) {
      const __m512i xx = _mm512_set1_epi32(x_pairs[r][p]);
      for (int c = 0; c < TILE_BLOCKS; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xx, (__m512bh)w[c]);
    }
  }
  for (int c = 0; c < TILE_BLOCKS; ++c) {
    const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + c * COLS) : _mm512_setzero_ps();
    for (int r = 0; r < ROWS; ++r) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][c], b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_stride + c * COLS), (__m256i)y);
    }
  }
}

using BlockFn = void (*)(const uint16_t*, int64_t, const int32_t*, int64_t, uint16_t*, int64_t, const float*, int64_t);
constexpr BlockFn BLOCK_FNS[MAX_ROWS + 1] = {nullptr,          block_rows<1>, block_rows<2>, block_rows<3>, block_rows<4>,
                                             block_rows<5>, block_rows<6>, block_rows<7>, block_rows<8>};
#endif

bool gemm_bf16_supported() { return ZSERVE_HAS_GEMM_BF16 != 0; }

at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features,
                     const c10::optional<at::Tensor>& bias_f32) {
  TORCH_CHECK(gemm_bf16_supported(), "gemm_bf16: this build has no AVX512-BF16 kernel");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "gemm_bf16: x must be contiguous bf16 [M, K]");
  TORCH_CHECK(w_packed.dim() == 3 && w_packed.scalar_type() == at::kInt && w_packed.is_contiguous() && w_packed.size(2) == COLS,
              "gemm_bf16: w_packed must be contiguous int32 [NB, K / 2, 16]");
  const int64_t M = x.size(0), K = x.size(1), num_blocks = w_packed.size(0), num_pairs = w_packed.size(1);
  TORCH_CHECK(K == 2 * num_pairs, "gemm_bf16: x has ", K, " columns, the weight ", 2 * num_pairs, " rows");
  TORCH_CHECK(out_features > (num_blocks - 1) * COLS && out_features <= num_blocks * COLS, "gemm_bf16: out_features does not match the blocks");
  const float* bias = nullptr;
  if (bias_f32.has_value()) {
    TORCH_CHECK(bias_f32->scalar_type() == at::kFloat && bias_f32->is_contiguous() && bias_f32->numel() == num_blocks * COLS,
                "gemm_bf16: bias must be contiguous float32 [NB * 16]");
    bias = bias_f32->data_ptr<float>();
  }
  at::Tensor out = at::empty({M, out_features}, x.options());
#if ZSERVE_HAS_GEMM_BF16
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const int32_t* wp = w_packed.data_ptr<int32_t>();
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const auto one_block = [&](int64_t b, int64_t m0) {  // rows m0.. of column block b, up to 8 at a time
    const int32_t* w_block = wp + b * num_pairs * COLS;
    const int64_t num_cols = std::min(COLS, out_features - b * COLS);
    const float* block_bias = bias != nullptr ? bias + b * COLS : nullptr;
    for (int64_t m = m0; m < M; m += MAX_ROWS) {
      const int64_t rows = std::min(MAX_ROWS, M - m);
      BLOCK_FNS[rows](xp + m * K, K, w_block, num_pairs, op + m * out_features + b * COLS, out_features, block_bias, num_cols);
    }
  };
  if (M < TILE_MIN_ROWS) {  // decode: stream each block once
    at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) one_block(b, 0);
    });
  } else {  // tiles of 4 full blocks x 6 rows; partial blocks and leftover rows go one block at a time
    const int64_t num_groups = (num_blocks + TILE_BLOCKS - 1) / TILE_BLOCKS;
    at::parallel_for(0, num_groups, 1, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t b0 = g * TILE_BLOCKS, b1 = std::min(num_blocks, b0 + TILE_BLOCKS);
        if (b1 - b0 < TILE_BLOCKS || b1 * COLS > out_features) {
          for (int64_t b = b0; b < b1; ++b) one_block(b, 0);
          continue;
        }
        const int64_t tiled = M - M % TILE_ROWS;
        for (int64_t m = 0; m < tiled; m += TILE_ROWS) {
          tile_rows<TILE_ROWS>(xp + m * K, K, wp + b0 * num_pairs * COLS, num_pairs * COLS, num_pairs, op + m * out_features + b0 * COLS,
                               out_features, bias != nullptr ? bias + b0 * COLS : nullptr);
        }
        if (tiled < M) {
          for (int64_t b = b0; b < b1; ++b) one_block(b, tiled);
        }
      }
    });
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gemm_bf16_supported() -> bool", &gemm_bf16_supported);
  m.def("gemm_bf16(Tensor x, Tensor w_packed, int out_features, Tensor? bias_f32) -> Tensor", &gemm_bf16);
}
