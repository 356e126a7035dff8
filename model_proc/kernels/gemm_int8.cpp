// int8-weight matrix product for the linear layers (--quantization int8) on every x86-64 CPU
// with AVX2 + FMA + F16C (and AVX-512F, where the build's instruction set has it):
//
//   zserve::gemm_int8(x, w_packed, scales, out_features, bias_f32, group_size) -> y
//
//   x           bf16, fp16 or fp32 [M, K]  contiguous (the runtime dtype)
//   w_packed    int8 [NB, K, 16]           Q [K, N] in blocks of 16 output columns (NB =
//                                          ceil(N / 16), zero-padded), gemm_widen's layout: one
//                                          block row is 16 bytes
//   scales      float32 [NB, NG, 16]       S [NG, N], NG = ceil(K / group_size): the scale of
//                                          rows [g G, (g + 1) G) of each column (G = K: one per
//                                          output channel)
//   bias_f32    float32 [NB * 16] or None
//   y           x's dtype [M, out_features]: x @ (Q * S) + bias, fp32 sums rounded once
//
// Small M (decode): each block streams once, its int8 values widened in registers (AVX2:
// VPMOVSXBD + VCVTDQ2PS, 8 at a time; AVX-512: 16), fp32 FMAs into per-group partial sums that
// are scaled once per group (one FMA per group and column): half of gemm_widen's bytes per
// weight. Larger M: each block is dequantized once (values x scales) into the fp32 scratch and
// goes through cpu_gemm.h's register tiles, as gemm_widen's does.
//
// Products of x and an int8 value are exact in fp32 only when x has at most 16 significant bits
// (bf16, fp16); the sums are fp32 either way: tests/model/test_gemm_int8.py holds it to the
// fp32 product of the dequantized weight.

#include <torch/library.h>

#include "cpu_gemm.h"

namespace {

using namespace zserve_gemm;

#if ZSERVE_HAS_GEMM_WIDEN

inline void widen_int8_row(const int8_t* p, vec* w) {
  for (int v = 0; v < NV; ++v) w[v] = widen(p + v * LANES);
}

// Small M: ROWS rows of fp32 x against one int8 block, group by group (cpu_gemm.h's
// accumulate_rows); each group's sum is scaled into the row's total once.
template <int ROWS>
inline void int8_block_rows(const float* x, int64_t K, const int8_t* w_block, const float* block_scales, int64_t G, float* sums) {
  vec total[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) total[r][v] = vzero();
  for (int64_t g0 = 0, g = 0; g0 < K; g0 += G, ++g) {
    vec acc[ROWS][split_of<ROWS>()][NV];
    accumulate_rows<ROWS>(x, K, g0, std::min(K, g0 + G), [&](int64_t k, vec* w) {
      prefetch_ahead(w_block + k * COLS, k);
      widen_int8_row(w_block + k * COLS, w);
    }, acc);
    vec scale[NV];
    for (int v = 0; v < NV; ++v) scale[v] = vload(block_scales + g * COLS + v * LANES);
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) total[r][v] = vfma(split_total<ROWS>(acc, r, v), scale[v], total[r][v]);
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, total[r][v]);
}

using Int8BlockFn = void (*)(const float*, int64_t, const int8_t*, const float*, int64_t, float*);
constexpr Int8BlockFn INT8_BLOCK_FNS[MAX_ROWS + 1] = {nullptr, int8_block_rows<1>, int8_block_rows<2>, int8_block_rows<3>, int8_block_rows<4>};

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scales, int64_t out_features, const float* bias, int64_t G,
         at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), num_blocks = w_packed.size(0), num_groups = scales.size(1);
  at::Tensor x_f32;
  const float* xp = x_as_f32<T>(x, x_f32);
  const int8_t* wp = w_packed.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  T* op = reinterpret_cast<T*>(out.data_ptr());
  if (M < TILE_MIN_ROWS) {
    streamed_gemm(xp, M, K, num_blocks, out_features, bias, op, [&](int rows, const float* x_rows, int64_t b, float* sums) {
      INT8_BLOCK_FNS[rows](x_rows, K, wp + b * K * COLS, sp + b * num_groups * COLS, G, sums);
    });
    return;
  }
  tiled_gemm(xp, M, K, num_blocks, out_features, bias, op, [&](int64_t b, float* scratch) {
    const int8_t* w_block = wp + b * K * COLS;
    const float* block_scales = sp + b * num_groups * COLS;
    for (int64_t g0 = 0, g = 0; g0 < K; g0 += G, ++g) {
      vec scale[NV];
      for (int v = 0; v < NV; ++v) scale[v] = vload(block_scales + g * COLS + v * LANES);
      for (int64_t k = g0; k < std::min(K, g0 + G); ++k) {
        vec w[NV];
        widen_int8_row(w_block + k * COLS, w);
        for (int v = 0; v < NV; ++v) vstore(scratch + k * COLS + v * LANES, vmul(w[v], scale[v]));
      }
    }
  });
}
#endif

bool gemm_int8_supported() { return ZSERVE_HAS_GEMM_WIDEN != 0; }

at::Tensor gemm_int8(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scales, int64_t out_features,
                     const c10::optional<at::Tensor>& bias_f32, int64_t group_size) {
  TORCH_CHECK(gemm_int8_supported(), "gemm_int8: this build has no AVX2 + FMA + F16C kernel");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat),
              "gemm_int8: x must be contiguous bf16, fp16 or fp32 [M, K]");
  TORCH_CHECK(w_packed.dim() == 3 && w_packed.scalar_type() == at::kChar && w_packed.is_contiguous() && w_packed.size(2) == COLS,
              "gemm_int8: w_packed must be contiguous int8 [NB, K, 16]");
  const int64_t K = x.size(1), num_blocks = w_packed.size(0);
  TORCH_CHECK(w_packed.size(1) == K, "gemm_int8: x has ", K, " columns, the weight ", w_packed.size(1), " rows");
  TORCH_CHECK(out_features > (num_blocks - 1) * COLS && out_features <= num_blocks * COLS, "gemm_int8: out_features does not match the blocks");
  TORCH_CHECK(group_size >= 1 && group_size <= std::max<int64_t>(K, 1), "gemm_int8: group_size must be in [1, K = ", K, "], got ", group_size);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.size(0) == num_blocks &&
                  scales.size(1) == num_groups && scales.size(2) == COLS,
              "gemm_int8: scales must be contiguous float32 [NB, ceil(K / group_size) = ", num_groups, ", 16]");
  const float* bias = checked_bias("gemm_int8", bias_f32, num_blocks);
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
#if ZSERVE_HAS_GEMM_WIDEN
  if (dtype == at::kBFloat16) {
    run<c10::BFloat16>(x, w_packed, scales, out_features, bias, group_size, out);
  } else if (dtype == at::kHalf) {
    run<c10::Half>(x, w_packed, scales, out_features, bias, group_size, out);
  } else {
    run<float>(x, w_packed, scales, out_features, bias, group_size, out);
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gemm_int8_supported() -> bool", &gemm_int8_supported);
  m.def("gemm_int8(Tensor x, Tensor w_packed, Tensor scales, int out_features, Tensor? bias_f32, int group_size) -> Tensor", &gemm_int8);
}
