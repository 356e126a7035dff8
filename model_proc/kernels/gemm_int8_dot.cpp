// int8 weights times int8 activations (--quantization int8 and GGUF Q8_0 in a 16-bit runtime):
//
//   zserve::gemm_int8_dot(x, w_quads, scales, out_features, bias_f32, group_size) -> y
//
//   x           bf16, fp16 or fp32 [M, K]   contiguous, K a multiple of 32
//   w_quads     uint8 [NB, K / 4, 16, 4]    Q + 128 for the weight Q [K, N] (int8) in blocks of 16
//                                           output columns (NB = ceil(N / 16), zero columns past N
//                                           hold 128): element (b, p, j, i) is Q[4p + i, 16b + j] + 128
//   scales      float32 [NB, NG, 16]        gemm_int8's: S [ceil(K / G), N] in column blocks
//   bias_f32    float32 [NB * 16] or None
//   group_size  G, a multiple of 32 (or K)
//   y           x's dtype [M, out_features]
//
// Each row of x is quantized first, in blocks of 32 along K: s = max|x| / 127 (fp32), and
// xq = round-half-even(x * (127 / max|x|)) in [-127, 127] (a block of zeros: s = 0, xq = 0).
// Then, per block of 32 k and 16 columns, the int32 dot products sum(Q * xq) are exact, and
//
//   y[m, n] = sum over blocks a of  float(sum_a Q * xq) * (S[g(a), n] * s[m, a])    (fp32, + bias)
//
// so what it computes is x with its rows quantized that way times the dequantized weight Q * S,
// with the products exact and the sums in fp32 (testing/int8_activations.py is the same rule in
// torch; tests/model/test_gemm_int8_dot.py holds the kernel to it).
//
// The dot products, 4 k x 16 columns per instruction and row (the quad layout: one 64-byte load
// is 16 columns x 4 k):
//   AVX512-VNNI (the avx512_bf16 level): VPDPBUSD (unsigned Q + 128 times signed xq, int32
//     sums), minus 128 * sum(xq) per block, which the quantizer hands over;
//   AVX-512 BW without VNNI, and AVX2: VPMADDUBSW + VPMADDWD on |Q| and xq with Q's sign
//     (VPMADDUBSW saturates its 16-bit pairs; 127 * 127 * 2 does not reach it, 255 * 127 * 2 would).
// Threads split the column blocks; rows go through a block ROWS at a time (the block, K x 16
// bytes, stays in L1 while they do), so a decode step streams each weight byte once, and a
// prefill reads x once per block from L2.

#include <torch/library.h>

#include <array>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "cpu_gemm.h"

namespace {

using namespace zserve_gemm;

constexpr int64_t ACT_BLOCK = 32;  // k per activation scale
constexpr int64_t QUAD = 4;        // k per 32-bit lane of a dot product

#if ZSERVE_HAS_GEMM_WIDEN

#if defined(__AVX512F__) && defined(__AVX512BW__)
using ivec = __m512i;  // 16 int32 lanes: the block's 16 columns
constexpr int IV = 1;
inline ivec izero() { return _mm512_setzero_si512(); }
inline ivec iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline ivec ibroadcast(const int8_t* p) { return _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }
inline ivec iset1(int32_t v) { return _mm512_set1_epi32(v); }
inline ivec isub(ivec a, ivec b) { return _mm512_sub_epi32(a, b); }
inline vec to_float(ivec v) { return _mm512_cvtepi32_ps(v); }
#if defined(__AVX512VNNI__)
constexpr int32_t WEIGHT_OFFSET = 128;  // the dot products are of Q + 128
inline ivec dot4(ivec acc, ivec w, ivec x) { return _mm512_dpbusd_epi32(acc, w, x); }
#else
constexpr int32_t WEIGHT_OFFSET = 0;  // the dot products are of Q
inline ivec dot4(ivec acc, ivec w, ivec x) {
  const ivec q = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  const __mmask64 negative = _mm512_movepi8_mask(q);
  const ivec x_signed = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
  const ivec pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(q), x_signed);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
#endif
#else
using ivec = __m256i;  // 8 int32 lanes: half the block's columns
constexpr int IV = 2;
constexpr int32_t WEIGHT_OFFSET = 0;
inline ivec izero() { return _mm256_setzero_si256(); }
inline ivec iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline ivec ibroadcast(const int8_t* p) { return _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }
inline ivec iset1(int32_t v) { return _mm256_set1_epi32(v); }
inline ivec isub(ivec a, ivec b) { return _mm256_sub_epi32(a, b); }
inline vec to_float(ivec v) { return _mm256_cvtepi32_ps(v); }
inline ivec dot4(ivec acc, ivec w, ivec x) {
  const ivec q = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  const ivec pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif
static_assert(IV == NV, "one int32 vector per fp32 vector of the block's columns");
constexpr int64_t QUAD_BYTES = COLS * QUAD;  // one k-quad of a block: 64 bytes
#if defined(__AVX512F__)
constexpr int DOT_ROWS = 8;  // 2 accumulators per row + the weights and x: 18 of 32 zmm
#else
constexpr int DOT_ROWS = 2;  // 2 x 2 accumulators per row + 2 weight vectors and the temporaries: 16 ymm
#endif

// One row's 32 values (fp32) -> 32 int8, their scale, and WEIGHT_OFFSET * their sum.
inline void quantize_block(const float* x, int8_t* q, float* scale, int32_t* offset_sum) {
#if defined(__AVX512F__)
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
#else
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 widest = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) widest = _mm256_max_ps(widest, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), magnitude));
  alignas(32) float lanes_max[8];
  _mm256_store_ps(lanes_max, widest);
  float amax = 0.0f;
  for (float lane : lanes_max) amax = std::max(amax, lane);
#endif
  const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  int32_t sum = 0;
#if defined(__AVX512F__)
  for (int64_t i = 0; i < ACT_BLOCK; i += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(inverse)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(v));
    sum += _mm512_reduce_add_epi32(v);
  }
#else
  __m256i v[4];
  __m256i total = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), _mm256_set1_ps(inverse)));
    total = _mm256_add_epi32(total, v[i]);
  }
  // packs work within 128-bit lanes: 32 bytes come out in the order 0 2 4 6 1 3 5 7 (of 4-byte groups)
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  for (int i = 0; i < 8; ++i) sum += lanes[i];
#endif
  *offset_sum = WEIGHT_OFFSET * sum;
}

struct QuantizedRows {
  at::Tensor q;            // int8 [M, K]
  at::Tensor scales;       // float32 [M, K / 32]
  at::Tensor offset_sums;  // int32 [M, K / 32]
};

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, const at::TensorOptions& options) {
  const int64_t num_blocks = K / ACT_BLOCK;
  QuantizedRows rows{at::empty({M, K}, options.dtype(at::kChar)), at::empty({M, num_blocks}, options.dtype(at::kFloat)),
                     at::empty({M, num_blocks}, options.dtype(at::kInt))};
  int8_t* q = rows.q.data_ptr<int8_t>();
  float* s = rows.scales.data_ptr<float>();
  int32_t* c = rows.offset_sums.data_ptr<int32_t>();
  at::parallel_for(0, M * num_blocks, std::max<int64_t>(1, 4096 / ACT_BLOCK), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * ACT_BLOCK, q + i * ACT_BLOCK, s + i, c + i);
  });
  return rows;
}

// ROWS rows of quantized x against one block of 16 columns -> ROWS x 16 fp32 sums.
template <int ROWS>
inline void dot_block_rows(const int8_t* xq, const float* xs, const int32_t* xc, int64_t K, const uint8_t* w_block,
                           const float* block_scales, int64_t G, float* sums) {
  const int64_t num_act = K / ACT_BLOCK;
  vec total[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) total[r][v] = vzero();
  for (int64_t a = 0; a < num_act; ++a) {
    const int64_t k0 = a * ACT_BLOCK;
    ivec dot[ROWS][IV];
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < IV; ++v) dot[r][v] = izero();
    for (int64_t k = k0; k < k0 + ACT_BLOCK; k += QUAD) {
      const uint8_t* w_quad = w_block + (k / QUAD) * QUAD_BYTES;
      _mm_prefetch(reinterpret_cast<const char*>(w_quad) + PREFETCH_BYTES, _MM_HINT_T0);
      ivec w[IV];
      for (int v = 0; v < IV; ++v) w[v] = iload(w_quad + v * (QUAD_BYTES / IV));
      for (int r = 0; r < ROWS; ++r) {
        const ivec xb = ibroadcast(xq + r * K + k);
        for (int v = 0; v < IV; ++v) dot[r][v] = dot4(dot[r][v], w[v], xb);
      }
    }
    const float* group_scales = block_scales + (k0 / G) * COLS;
    vec weight_scale[NV];
    for (int v = 0; v < NV; ++v) weight_scale[v] = vload(group_scales + v * LANES);
    for (int r = 0; r < ROWS; ++r) {
      const vec row_scale = vset1(xs[r * num_act + a]);
      const ivec offset = iset1(xc[r * num_act + a]);
      for (int v = 0; v < NV; ++v) total[r][v] = vfma(to_float(isub(dot[r][v], offset)), vmul(weight_scale[v], row_scale), total[r][v]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, total[r][v]);
}

template <int... R>
constexpr auto dot_fns(std::integer_sequence<int, R...>) {
  using Fn = void (*)(const int8_t*, const float*, const int32_t*, int64_t, const uint8_t*, const float*, int64_t, float*);
  return std::array<Fn, sizeof...(R)>{{dot_block_rows<R + 1>...}};
}
constexpr auto DOT_FNS = dot_fns(std::make_integer_sequence<int, DOT_ROWS>{});  // DOT_FNS[rows - 1]

template <typename T>
void run(const at::Tensor& x, const at::Tensor& w_quads, const at::Tensor& scales, int64_t out_features, const float* bias, int64_t G,
         at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), num_blocks = w_quads.size(0), num_groups = scales.size(1), num_act = K / ACT_BLOCK;
  at::Tensor x_f32;
  const QuantizedRows rows = quantize_rows(x_as_f32<T>(x, x_f32), M, K, x.options());
  const int8_t* xq = rows.q.data_ptr<int8_t>();
  const float* xs = rows.scales.data_ptr<float>();
  const int32_t* xc = rows.offset_sums.data_ptr<int32_t>();
  const uint8_t* wp = w_quads.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  T* op = reinterpret_cast<T*>(out.data_ptr());
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float sums[DOT_ROWS * COLS];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t num_cols = std::min(COLS, out_features - b * COLS);
      for (int64_t m = 0; m < M; m += DOT_ROWS) {
        const int n_rows = static_cast<int>(std::min<int64_t>(DOT_ROWS, M - m));
        DOT_FNS[n_rows - 1](xq + m * K, xs + m * num_act, xc + m * num_act, K, wp + b * K * COLS, sp + b * num_groups * COLS, G, sums);
        store_rows(sums, n_rows, bias != nullptr ? bias + b * COLS : nullptr, op + m * out_features + b * COLS, out_features, num_cols);
      }
    }
  });
}
#endif

bool gemm_int8_dot_supported() { return ZSERVE_HAS_GEMM_WIDEN != 0; }

// The dot products this build uses: "vpdpbusd", "vpmaddubsw" or "" (no kernel).
std::string gemm_int8_dot_instruction() {
#if ZSERVE_HAS_GEMM_WIDEN
  return WEIGHT_OFFSET != 0 ? "vpdpbusd" : "vpmaddubsw";
#else
  return "";
#endif
}

at::Tensor gemm_int8_dot(const at::Tensor& x, const at::Tensor& w_quads, const at::Tensor& scales, int64_t out_features,
                         const c10::optional<at::Tensor>& bias_f32, int64_t group_size) {
  TORCH_CHECK(gemm_int8_dot_supported(), "gemm_int8_dot: this build has no AVX2 kernel");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat),
              "gemm_int8_dot: x must be contiguous bf16, fp16 or fp32 [M, K]");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % ACT_BLOCK == 0 && K > 0, "gemm_int8_dot: K must be a positive multiple of 32, got ", K);
  TORCH_CHECK(w_quads.dim() == 4 && w_quads.scalar_type() == at::kByte && w_quads.is_contiguous() && w_quads.size(1) == K / QUAD &&
                  w_quads.size(2) == COLS && w_quads.size(3) == QUAD,
              "gemm_int8_dot: w_quads must be contiguous uint8 [NB, K / 4 = ", K / QUAD, ", 16, 4]");
  const int64_t num_blocks = w_quads.size(0);
  TORCH_CHECK(out_features > (num_blocks - 1) * COLS && out_features <= num_blocks * COLS, "gemm_int8_dot: out_features does not match the blocks");
  TORCH_CHECK(group_size == K || (group_size > 0 && group_size % ACT_BLOCK == 0 && group_size <= K),
              "gemm_int8_dot: group_size must be K or a multiple of 32 up to K, got ", group_size);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.size(0) == num_blocks &&
                  scales.size(1) == num_groups && scales.size(2) == COLS,
              "gemm_int8_dot: scales must be contiguous float32 [NB, ceil(K / group_size) = ", num_groups, ", 16]");
  const float* bias = checked_bias("gemm_int8_dot", bias_f32, num_blocks);
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
#if ZSERVE_HAS_GEMM_WIDEN
  if (x.size(0) > 0) {
    if (dtype == at::kBFloat16) {
      run<c10::BFloat16>(x, w_quads, scales, out_features, bias, group_size, out);
    } else if (dtype == at::kHalf) {
      run<c10::Half>(x, w_quads, scales, out_features, bias, group_size, out);
    } else {
      run<float>(x, w_quads, scales, out_features, bias, group_size, out);
    }
  }
#endif
  return out;
}

// The quantizer alone (tests hold it to testing/int8_activations.py): (xq, s, WEIGHT_OFFSET * sum(xq)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(gemm_int8_dot_supported(), "quantize_activations: this build has no AVX2 kernel");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(1) % ACT_BLOCK == 0,
              "quantize_activations: x must be contiguous float32 [M, K], K a multiple of 32");
#if ZSERVE_HAS_GEMM_WIDEN
  QuantizedRows rows = quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), x.options());
  return {rows.q, rows.scales, rows.offset_sums};
#else
  return {};
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gemm_int8_dot_supported() -> bool", &gemm_int8_dot_supported);
  m.def("gemm_int8_dot_instruction() -> str", &gemm_int8_dot_instruction);
  m.def("gemm_int8_dot(Tensor x, Tensor w_quads, Tensor scales, int out_features, Tensor? bias_f32, int group_size) -> Tensor", &gemm_int8_dot);
  m.def("quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor)", &quantize_activations);
}
