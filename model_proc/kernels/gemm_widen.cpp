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
// scratch, then the register tiles. The drivers and the tiles are cpu_gemm.h's, shared with
// gemm_int8.cpp.
//
// The instruction set is the build's (model_proc/kernels/cpu_isa.py picks -march per ISA): a
// build for avx2 never issues an AVX-512 instruction.

#include <torch/library.h>

#include "cpu_gemm.h"

namespace {

using namespace zserve_gemm;

#if ZSERVE_HAS_GEMM_WIDEN

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

// Small M: ROWS rows of fp32 x against one 16-bit block, widened in registers.
template <typename T, int ROWS>
inline void block_rows(const float* x, int64_t K, const T* w_block, float* sums) {
  vec acc[ROWS][split_of<ROWS>()][NV];
  accumulate_rows<ROWS>(x, K, 0, K, [&](int64_t k, vec* w) {
    prefetch_ahead(w_block + k * COLS, k);
    widen_row(w_block + k * COLS, w);
  }, acc);
  for (int r = 0; r < ROWS; ++r) {
    vec total[NV];
    for (int v = 0; v < NV; ++v) total[v] = split_total<ROWS>(acc, r, v);
    in_column_order<T>(total);
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, total[v]);
  }
}

template <typename T>
using BlockFn = void (*)(const float*, int64_t, const T*, float*);
template <typename T>
constexpr BlockFn<T> BLOCK_FNS[MAX_ROWS + 1] = {nullptr, block_rows<T, 1>, block_rows<T, 2>, block_rows<T, 3>, block_rows<T, 4>};

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w_packed, int64_t out_features, const float* bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), num_blocks = w_packed.size(0);
  at::Tensor x_f32;  // x widened once to fp32 (M x K: small next to the weights)
  const float* xp = x_as_f32<T>(x, x_f32);
  const T* wp = reinterpret_cast<const T*>(w_packed.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());
  if (M < TILE_MIN_ROWS) {
    streamed_gemm(xp, M, K, num_blocks, out_features, bias, op,
                  [&](int rows, const float* x_rows, int64_t b, float* sums) { BLOCK_FNS<T>[rows](x_rows, K, wp + b * K * COLS, sums); });
    return;
  }
  tiled_gemm(xp, M, K, num_blocks, out_features, bias, op, [&](int64_t b, float* scratch) {
    const T* w_block = wp + b * K * COLS;
    for (int64_t k = 0; k < K; ++k) {
      vec w[NV];
      widen_row(w_block + k * COLS, w);
      in_column_order<T>(w);
      for (int v = 0; v < NV; ++v) vstore(scratch + k * COLS + v * LANES, w[v]);
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
  const float* bias = checked_bias("gemm_widen", bias_f32, num_blocks);
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
