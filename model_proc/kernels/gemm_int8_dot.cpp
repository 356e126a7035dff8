// int8 and 4-bit weights times int8 activations (--quantization int8, and a GGUF file's quantized
// matrices kept as stored):
//
//   zserve::gemm_int8_dot(x, w_quads, scales, offsets, out_features, bias_f32, group_size) -> y
//   zserve::gemm_int4_dot(x, w_nibbles, scales, offsets, out_features, bias_f32, group_size) -> y
//   zserve::gemm_dot_compact(x, codes, bits, scale_supers, scale_subs, offset_supers, offset_subs,
//                            out_features, bias_f32, group_size, implied_offset) -> y
//
// The weight W [K, N] is codes C times scales S plus offsets O (None: 0), with S and O per group
// of G input rows and column: W = C * S + O. int8 codes: --quantization int8, GGUF Q8_0 and Q6_K
// (G = 16), Q5_K's 5-bit codes; 4-bit codes: GGUF Q4_0, Q4_1 and Q4_K (offsets -8 d, m, -dmin m).
//
//   x           bf16, fp16 or fp32 [M, K]   contiguous, K a multiple of 32
//   w_quads     uint8 [NB, K / 4, 16, 4]    C + 128 for int8 codes C [K, N], in blocks of 16 output
//                                           columns (NB = ceil(N / 16); columns past N hold 128):
//                                           element (b, p, j, i) is C[4p + i, 16b + j] + 128
//   w_nibbles   uint8 [NB, K / 8, 16, 4]    codes C in [0, 15]: element (b, p, j, i) holds C[8p + i, 16b + j]
//                                           in its low nibble and C[8p + 4 + i, 16b + j] in its high one
//   6-bit codes uint8 [NB, 3K / 16, 16, 4]  (gemm_dot_compact, bits 6: GGUF Q6_K) codes C + 32 in [0, 63]
//                                           of int8 codes C, in six_bit_codes.h's units of 16 k: the
//                                           nibble layout's low 4 bits plus a plane of the 2 high bits
//   scales      float32 [NB, NG, 16]        S [ceil(K / G), N] in column blocks (gemm_int8's layout)
//   offsets     float32 [NB, NG, 16] or None  O, likewise
//   bias_f32    float32 [NB * 16] or None
//   group_size  G: 16, a multiple of 32, or K
//   y           x's dtype [M, out_features]
//
// Each row of x is quantized first, in blocks of 32 along K: s = max|x| / 127 (fp32), and
// xq = round-half-even(x * (127 / max|x|)) in [-127, 127] (a block of zeros: s = 0, xq = 0).
// Then, per sub-block a of min(G, 32) k and 16 columns, the int32 dot products sum(C * xq) are
// exact, and
//
//   y[m, n] = sum over a of  float(sum_a C * xq) * (S[g(a), n] * s[m, a]) + O[g(a), n] * (s[m, a] * sum_a xq)
//
// in fp32 (+ bias), rounded once: x with its rows quantized that way times C * S + O, with the
// products exact (layers/int8_activations.py is the same rule in torch; tests/model/
// test_gemm_int8_dot.py and test_gemm_int4_dot.py hold the kernels to it).
//
// The dot products, 4 k x 16 columns per zmm instruction (two ymm ones) and row (the quad layout:
// one 64-byte load is 16 columns x 4 k, or x 8 k in nibbles), by the build's feature set
// (model_proc/kernels/cpu_isa.py; gemm_int8_dot_instruction() says which):
//   "vpdpbusd zmm"             avx512 + avx512_vnni (Cascade Lake, Ice Lake, Zen 4 and later);
//   "vpdpbusd ymm (avx-vnni)"  a 256-bit build with avx_vnni (Alder Lake and later clients): the
//                              VEX-encoded VPDPBUSD, same arithmetic;
//     VPDPBUSD: unsigned C + 128 (or a nibble) times signed xq, int32 sums, minus 128 * sum(xq)
//     for int8 codes, which the quantizer hands over (6-bit codes: C + 32 decoded in registers,
//     minus 32 * sum(xq) on every path, the same int32 sums as C's);
//   "vpmaddubsw zmm" / "ymm"   avx512 without avx512_vnni (Skylake-SP), and avx2 without avx_vnni
//                              (Zen 2/3, Haswell..Comet Lake): VPMADDUBSW + VPMADDWD + VPADDD; int8
//     codes as |C| and xq with C's sign (VPMADDUBSW saturates its 16-bit pairs: 127 * 127 * 2 does
//     not reach it, 255 * 127 * 2 would), nibbles as they are (15 * 127 * 2).
// Every path computes the same exact int32 sums, so the results are bit-identical across them.
// Threads split the column blocks; rows go through a block ROWS at a time (the block stays in L1
// while they do), so a decode step streams each weight byte once, and a prefill reads x once per
// block from L2.

#include <torch/library.h>

#include <array>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "int8_dot.h"
#include "six_bit_codes.h"

namespace {

using namespace zserve_int8_dot;

#if ZSERVE_HAS_GEMM_WIDEN

#if defined(__AVX512F__) && defined(__AVX512BW__)
using ivec = __m512i;  // 16 int32 lanes: the block's 16 columns
constexpr int IV = 1;
inline ivec izero() { return _mm512_setzero_si512(); }
inline ivec iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline ivec ibroadcast(const int8_t* p) { return _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }
inline ivec iset1(int32_t v) { return _mm512_set1_epi32(v); }
inline ivec isub(ivec a, ivec b) { return _mm512_sub_epi32(a, b); }
inline ivec low_nibbles(ivec v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
inline ivec high_nibbles(ivec v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
inline ivec iand(ivec a, ivec b) { return _mm512_and_si512(a, b); }
inline ivec ior(ivec a, ivec b) { return _mm512_or_si512(a, b); }
inline ivec ibytes(char v) { return _mm512_set1_epi8(v); }
template <int N> inline ivec shl16(ivec v) { return _mm512_slli_epi16(v, N); }
template <int N> inline ivec shr16(ivec v) { return _mm512_srli_epi16(v, N); }
inline vec to_float(ivec v) { return _mm512_cvtepi32_ps(v); }
#if defined(__AVX512VNNI__)
constexpr const char* INSTRUCTION = "vpdpbusd zmm";
constexpr int32_t WEIGHT_OFFSET = 128;  // int8 weights: the dot products are of Q + 128
inline ivec dot4_int8(ivec acc, ivec w, ivec x) { return _mm512_dpbusd_epi32(acc, w, x); }
inline ivec dot4_codes(ivec acc, ivec w, ivec x) { return _mm512_dpbusd_epi32(acc, w, x); }
#else
constexpr const char* INSTRUCTION = "vpmaddubsw zmm";
constexpr int32_t WEIGHT_OFFSET = 0;  // int8 weights: the dot products are of Q
inline ivec dot4_codes(ivec acc, ivec w, ivec x) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}
inline ivec dot4_int8(ivec acc, ivec w, ivec x) {
  const ivec q = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  const __mmask64 negative = _mm512_movepi8_mask(q);
  const ivec x_signed = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
  return dot4_codes(acc, _mm512_abs_epi8(q), x_signed);
}
#endif
#else
using ivec = __m256i;  // 8 int32 lanes: half the block's columns
constexpr int IV = 2;
inline ivec izero() { return _mm256_setzero_si256(); }
inline ivec iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline ivec ibroadcast(const int8_t* p) { return _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(p)); }
inline ivec iset1(int32_t v) { return _mm256_set1_epi32(v); }
inline ivec isub(ivec a, ivec b) { return _mm256_sub_epi32(a, b); }
inline ivec low_nibbles(ivec v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
inline ivec high_nibbles(ivec v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
inline ivec iand(ivec a, ivec b) { return _mm256_and_si256(a, b); }
inline ivec ior(ivec a, ivec b) { return _mm256_or_si256(a, b); }
inline ivec ibytes(char v) { return _mm256_set1_epi8(v); }
template <int N> inline ivec shl16(ivec v) { return _mm256_slli_epi16(v, N); }
template <int N> inline ivec shr16(ivec v) { return _mm256_srli_epi16(v, N); }
inline vec to_float(ivec v) { return _mm256_cvtepi32_ps(v); }
#if defined(__AVXVNNI__)
constexpr const char* INSTRUCTION = "vpdpbusd ymm (avx-vnni)";
constexpr int32_t WEIGHT_OFFSET = 128;  // int8 weights: the dot products are of Q + 128
inline ivec dot4_int8(ivec acc, ivec w, ivec x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
inline ivec dot4_codes(ivec acc, ivec w, ivec x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
#else
constexpr const char* INSTRUCTION = "vpmaddubsw ymm";
constexpr int32_t WEIGHT_OFFSET = 0;
inline ivec dot4_codes(ivec acc, ivec w, ivec x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
inline ivec dot4_int8(ivec acc, ivec w, ivec x) {
  const ivec q = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  return dot4_codes(acc, _mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
}
#endif
#endif
static_assert(IV == NV, "one int32 vector per fp32 vector of the block's columns");
constexpr int64_t QUAD_BYTES = COLS * QUAD;  // one 64-byte load: 16 columns x 4 codes (nibbles: x 8)
static_assert(zserve_six_bit::ROW_BYTES == QUAD_BYTES, "a 6-bit unit is three rows of the quad layout");

// One 6-bit unit's rows (six_bit_codes.h; the same bytes of each row) -> the codes C + 32 of its k
// 4s..4s+3, s = 0..3, one quad per column as VPDPBUSD reads them: the nibbles' low 4 bits OR'd with
// bits 2s..2s+1 of the plane moved to bits 4-5 (16-bit shifts: what crosses a byte is masked off).
inline void decode_six_bit(ivec low0, ivec low1, ivec high, ivec* codes) {
  const ivec nibble = ibytes(0x0f), top = ibytes(0x30);
  codes[0] = ior(iand(low0, nibble), iand(shl16<4>(high), top));
  codes[1] = ior(iand(shr16<4>(low0), nibble), iand(shl16<2>(high), top));
  codes[2] = ior(iand(low1, nibble), iand(high, top));
  codes[3] = ior(iand(shr16<4>(low1), nibble), iand(shr16<2>(high), top));
}
#if defined(__AVX512F__)
constexpr int DOT_ROWS = 8;  // 2 accumulators per row + the weights and x: 18 of 32 zmm
#else
constexpr int DOT_ROWS = 2;  // 2 x 2 accumulators per row + 2 weight vectors and the temporaries: 16 ymm
#endif

// One row's 32 values (fp32) -> 32 int8, their scale, and the sums of each 16 of them.
inline void quantize_block(const float* x, int8_t* q, float* scale, int32_t* sums16) {
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
#if defined(__AVX512F__)
  for (int64_t i = 0; i < ACT_BLOCK; i += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(inverse)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(v));
    sums16[i / 16] = _mm512_reduce_add_epi32(v);
  }
#else
  __m256i v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), _mm256_set1_ps(inverse)));
  // packs work within 128-bit lanes: 32 bytes come out in the order 0 2 4 6 1 3 5 7 (of 4-byte groups)
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  for (int half = 0; half < 2; ++half) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi32(v[2 * half], v[2 * half + 1]));
    int32_t sum = 0;
    for (int32_t lane : lanes) sum += lane;
    sums16[half] = sum;
  }
#endif
}

struct QuantizedRows {
  at::Tensor q;       // int8 [M, K]
  at::Tensor scales;  // float32 [M, K / 32]
  at::Tensor sums16;  // int32 [M, K / 16]: the sum of xq over each 16 k
};

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, const at::TensorOptions& options) {
  const int64_t num_blocks = K / ACT_BLOCK;
  QuantizedRows rows{at::empty({M, K}, options.dtype(at::kChar)), at::empty({M, num_blocks}, options.dtype(at::kFloat)),
                     at::empty({M, K / SUM_BLOCK}, options.dtype(at::kInt))};
  int8_t* q = rows.q.data_ptr<int8_t>();
  float* s = rows.scales.data_ptr<float>();
  int32_t* c = rows.sums16.data_ptr<int32_t>();
  at::parallel_for(0, M * num_blocks, std::max<int64_t>(1, 4096 / ACT_BLOCK), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) quantize_block(x + i * ACT_BLOCK, q + i * ACT_BLOCK, s + i, c + 2 * i);
  });
  return rows;
}

// ROWS rows of quantized x against one block of 16 columns -> ROWS x 16 fp32 sums. The k range
// goes in sub-blocks of SB = min(G, 32) k: one int32 dot product per row and sub-block, then one
// rescale (and, with offsets, one more FMA).
template <Codes KIND, int ROWS>
inline void dot_block_rows(const int8_t* xq, const float* xs, const int32_t* x_sums16, int64_t K, const Weights& w, float* sums) {
  constexpr int64_t K_PER_LOAD = KIND == Codes::NIBBLES ? 2 * QUAD : KIND == Codes::SIX ? zserve_six_bit::K_PER_UNIT : QUAD;
  constexpr int64_t LOAD_BYTES = KIND == Codes::SIX ? zserve_six_bit::UNIT_BYTES : QUAD_BYTES;
  const int64_t num_act = K / ACT_BLOCK, num_sums = K / SUM_BLOCK;
  const int64_t sub_block = std::min<int64_t>(w.G, ACT_BLOCK);
  vec total[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) total[r][v] = vzero();
  for (int64_t k0 = 0; k0 < K; k0 += sub_block) {
    ivec dot[ROWS][IV];
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < IV; ++v) dot[r][v] = izero();
    for (int64_t k = k0; k < k0 + sub_block; k += K_PER_LOAD) {
      const uint8_t* w_load = w.codes + (k / K_PER_LOAD) * LOAD_BYTES;
      for (int64_t line = 0; line < LOAD_BYTES; line += QUAD_BYTES)
        _mm_prefetch(reinterpret_cast<const char*>(w_load) + PREFETCH_BYTES + line, _MM_HINT_T0);
      if constexpr (KIND == Codes::SIX) {  // 16 k: the codes decoded once, then every row's 4 dot products
        ivec codes[IV][4];
        for (int v = 0; v < IV; ++v) {
          const uint8_t* lane = w_load + v * (QUAD_BYTES / IV);
          decode_six_bit(iload(lane), iload(lane + QUAD_BYTES), iload(lane + 2 * QUAD_BYTES), codes[v]);
        }
        for (int r = 0; r < ROWS; ++r)
          for (int s = 0; s < 4; ++s) {
            const ivec xb = ibroadcast(xq + r * K + k + QUAD * s);
            for (int v = 0; v < IV; ++v) dot[r][v] = dot4_codes(dot[r][v], codes[v][s], xb);
          }
        continue;
      }
      ivec wv[IV];
      for (int v = 0; v < IV; ++v) wv[v] = iload(w_load + v * (QUAD_BYTES / IV));
      if constexpr (KIND == Codes::NIBBLES) {
        ivec high[IV];
        for (int v = 0; v < IV; ++v) {
          high[v] = high_nibbles(wv[v]);
          wv[v] = low_nibbles(wv[v]);
        }
        for (int r = 0; r < ROWS; ++r) {
          const ivec x_low = ibroadcast(xq + r * K + k), x_high = ibroadcast(xq + r * K + k + QUAD);
          for (int v = 0; v < IV; ++v) dot[r][v] = dot4_codes(dot4_codes(dot[r][v], wv[v], x_low), high[v], x_high);
        }
      } else {
        for (int r = 0; r < ROWS; ++r) {
          const ivec xb = ibroadcast(xq + r * K + k);
          for (int v = 0; v < IV; ++v) dot[r][v] = dot4_int8(dot[r][v], wv[v], xb);
        }
      }
    }
    const int64_t g = k0 / w.G, a = k0 / ACT_BLOCK, first_sum = k0 / SUM_BLOCK;
    vec weight_scale[NV], weight_offset[NV];
    w.group(g, weight_scale, weight_offset);
    for (int r = 0; r < ROWS; ++r) {
      const float row_scale = xs[r * num_act + a];
      const int32_t* row_sums = x_sums16 + r * num_sums + first_sum;
      const int32_t x_sum = sub_block == SUM_BLOCK ? row_sums[0] : row_sums[0] + row_sums[1];
      const vec scale = vset1(row_scale);
      // VPDPBUSD took C + 128; 6-bit codes are C + 32 on every path
      const int32_t code_offset = KIND == Codes::INT8 ? WEIGHT_OFFSET : KIND == Codes::SIX ? zserve_six_bit::CODE_OFFSET : 0;
      const ivec correction = iset1(code_offset * x_sum);
      for (int v = 0; v < NV; ++v) total[r][v] = vfma(to_float(isub(dot[r][v], correction)), vmul(weight_scale[v], scale), total[r][v]);
      if (w.has_offsets()) {
        const vec scaled_sum = vset1(row_scale * static_cast<float>(x_sum));
        for (int v = 0; v < NV; ++v) total[r][v] = vfma(weight_offset[v], scaled_sum, total[r][v]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) vstore(sums + r * COLS + v * LANES, total[r][v]);
}

using DotFn = void (*)(const int8_t*, const float*, const int32_t*, int64_t, const Weights&, float*);

template <Codes KIND, int... R>
constexpr std::array<DotFn, sizeof...(R)> dot_fns(std::integer_sequence<int, R...>) {
  return {{dot_block_rows<KIND, R + 1>...}};
}
template <Codes KIND>
constexpr std::array<DotFn, DOT_ROWS> DOT_FNS = dot_fns<KIND>(std::make_integer_sequence<int, DOT_ROWS>{});  // [rows - 1]

template <typename T, Codes KIND>
void run(const at::Tensor& x, const WeightLayout& layout, int64_t num_blocks, int64_t out_features, const float* bias,
         at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {  // many rows of bf16: through bf16 tiles where the CPU has them
    if (M >= BF16_TILE_MIN_ROWS && bf16_tiles_granted()) return gemm_bf16_tiles(KIND, x, layout, num_blocks, out_features, bias, out);
  }
  const int64_t num_act = K / ACT_BLOCK, num_sums = K / SUM_BLOCK;
  at::Tensor x_f32;
  const QuantizedRows rows = quantize_rows(x_as_f32<T>(x, x_f32), M, K, x.options());
  const int8_t* xq = rows.q.data_ptr<int8_t>();
  const float* xs = rows.scales.data_ptr<float>();
  const int32_t* x_sums16 = rows.sums16.data_ptr<int32_t>();
  T* op = reinterpret_cast<T*>(out.data_ptr());
  // whole tiles of 16 rows in AMX tiles (gemm_amx.cpp) where granted, from AMX_MIN_ROWS rows; the rest here
  const int64_t amx_rows = M >= AMX_MIN_ROWS && amx_granted() ? M / AMX_MIN_ROWS * AMX_MIN_ROWS : 0;
  const AmxRowTerms amx_terms = amx_rows > 0 ? amx_row_terms(xs, x_sums16, amx_rows, K, layout.first.G) : AmxRowTerms{};
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float sums[DOT_ROWS * COLS];
    std::vector<float> amx_sums(amx_rows * COLS);
    std::vector<uint8_t> amx_scratch(amx_rows > 0 && KIND != Codes::INT8 ? K * COLS : 0);  // nibbles or 6-bit codes as bytes
    for (int64_t b = b0; b < b1; ++b) {
      const Weights w = layout.at(b);
      const int64_t num_cols = std::min(COLS, out_features - b * COLS);
      const float* block_bias = bias != nullptr ? bias + b * COLS : nullptr;
      if (amx_rows > 0) {
        amx_dot_rows(KIND, xq, xs, amx_terms, amx_rows, K, w, amx_scratch.data(), amx_sums.data());
        store_rows(amx_sums.data(), static_cast<int>(amx_rows), block_bias, op + b * COLS, out_features, num_cols);
      }
      for (int64_t m = amx_rows; m < M; m += DOT_ROWS) {
        const int n_rows = static_cast<int>(std::min<int64_t>(DOT_ROWS, M - m));
        DOT_FNS<KIND>[n_rows - 1](xq + m * K, xs + m * num_act, x_sums16 + m * num_sums, K, w, sums);
        store_rows(sums, n_rows, block_bias, op + m * out_features + b * COLS, out_features, num_cols);
      }
    }
    if (amx_rows > 0) amx_end();
  });
}

template <Codes KIND>
void run_dtype(const at::Tensor& x, const WeightLayout& layout, int64_t num_blocks, int64_t out_features, const float* bias,
               at::Tensor& out) {
  if (x.size(0) == 0) return;
  if (x.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16, KIND>(x, layout, num_blocks, out_features, bias, out);
  } else if (x.scalar_type() == at::kHalf) {
    run<c10::Half, KIND>(x, layout, num_blocks, out_features, bias, out);
  } else {
    run<float, KIND>(x, layout, num_blocks, out_features, bias, out);
  }
}
#endif

bool gemm_int8_dot_supported() { return ZSERVE_HAS_GEMM_WIDEN != 0; }

// The dot products this build uses: "vpdpbusd zmm", "vpdpbusd ymm (avx-vnni)", "vpmaddubsw zmm",
// "vpmaddubsw ymm", or "" (no kernel); with AMX granted "tdpbsud (amx-int8) from 16 rows, <that> below";
// cpu_isa.py's int8_dot_instruction() is the same rule.
std::string gemm_int8_dot_instruction() {
#if ZSERVE_HAS_GEMM_WIDEN
  if (amx_granted()) return "tdpbsud (amx-int8) from " + std::to_string(AMX_MIN_ROWS) + " rows, " + INSTRUCTION + " below";
  return INSTRUCTION;
#else
  return "";
#endif
}

// Whether many rows go through AMX tiles: a build with amx_int8 whose process the OS let use them.
bool gemm_int8_dot_amx_granted() {
#if ZSERVE_HAS_GEMM_WIDEN
  return amx_granted();
#else
  return false;
#endif
}

// From how many rows a bf16 x goes through bf16 tiles (bf16_tiles.cpp); 0: never here.
int64_t gemm_int8_dot_bf16_tile_rows() {
#if ZSERVE_HAS_GEMM_WIDEN
  return bf16_tiles_granted() ? BF16_TILE_MIN_ROWS : 0;
#else
  return 0;
#endif
}

// Rows of 64 bytes per column block that K codes of `bits` bits take (quads, nibbles, 6-bit units).
int64_t code_rows(int64_t bits, int64_t K) { return bits == 8 ? K / QUAD : bits == 4 ? K / (2 * QUAD) : 3 * K / 16; }

// The checks the ops make; returns the number of groups.
int64_t check_args(const char* name, const at::Tensor& x, const at::Tensor& codes, int64_t bits, const at::Tensor& scales,
                   int64_t out_features, int64_t group_size) {
  TORCH_CHECK(gemm_int8_dot_supported(), name, ": this build has no AVX2 kernel");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat),
              name, ": x must be contiguous bf16, fp16 or fp32 [M, K]");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % ACT_BLOCK == 0 && K > 0, name, ": K must be a positive multiple of 32, got ", K);
  const int64_t rows = code_rows(bits, K);
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(1) == rows &&
                  codes.size(2) == COLS && codes.size(3) == QUAD,
              name, ": the codes must be contiguous uint8 [NB, ", bits == 8 ? "K / 4" : bits == 4 ? "K / 8" : "3K / 16", " = ", rows,
              ", 16, 4]");
  const int64_t num_blocks = codes.size(0);
  TORCH_CHECK(out_features > (num_blocks - 1) * COLS && out_features <= num_blocks * COLS, name, ": out_features does not match the blocks");
  TORCH_CHECK(group_size == K || group_size == SUM_BLOCK || (group_size > 0 && group_size % ACT_BLOCK == 0 && group_size <= K),
              name, ": group_size must be K, 16 or a multiple of 32 up to K, got ", group_size);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.size(0) == num_blocks &&
                  scales.size(1) == num_groups && scales.size(2) == COLS,
              name, ": scales must be contiguous float32 [NB, ceil(K / group_size) = ", num_groups, ", 16]");
  return num_groups;
}

const float* checked_offsets(const char* name, const c10::optional<at::Tensor>& offsets, const at::Tensor& scales) {
  if (!offsets.has_value()) return nullptr;
  TORCH_CHECK(offsets->sizes() == scales.sizes() && offsets->scalar_type() == at::kFloat && offsets->is_contiguous(),
              name, ": offsets must be contiguous float32 shaped like the scales");
  return offsets->data_ptr<float>();
}

template <Codes KIND>
at::Tensor gemm_dot(const char* name, const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                    const c10::optional<at::Tensor>& offsets, int64_t out_features, const c10::optional<at::Tensor>& bias_f32,
                    int64_t group_size) {
  check_args(name, x, codes, KIND == Codes::NIBBLES ? 4 : 8, scales, out_features, group_size);
  const float* offset_ptr = checked_offsets(name, offsets, scales);
  const float* bias = checked_bias(name, bias_f32, codes.size(0));
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
#if ZSERVE_HAS_GEMM_WIDEN
  const int64_t num_blocks = codes.size(0);
  const WeightLayout layout{Weights{codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), offset_ptr, group_size},
                            codes.numel() / num_blocks, scales.size(1), 0};
  run_dtype<KIND>(x, layout, num_blocks, out_features, bias, out);
#endif
  return out;
}

// A GGUF file's scales as it keeps them (layers/compact_scales.py): S = fp16 super[g / R] * int8 sub[g]
// (scale_subs None: S = super, the file's d of a one-group block), O likewise (offset_supers None: the
// scale supers; offset_subs None: O = super * implied_offset, and no offsets where that is 0).
// bits 4 (nibbles), 6 (six_bit_codes.h) or 8 (quads).
at::Tensor gemm_dot_compact(const at::Tensor& x, const at::Tensor& codes, int64_t bits, const at::Tensor& scale_supers,
                            const c10::optional<at::Tensor>& scale_subs, const c10::optional<at::Tensor>& offset_supers,
                            const c10::optional<at::Tensor>& offset_subs, int64_t out_features,
                            const c10::optional<at::Tensor>& bias_f32, int64_t group_size, int64_t implied_offset) {
  const char* name = "gemm_dot_compact";
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8, name, ": bits must be 4, 6 or 8, got ", bits);
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 4 && group_size > 0, name, ": x must be [M, K] and the codes [NB, rows, 16, 4]");
  const int64_t num_blocks = codes.size(0), num_groups = (x.size(1) + group_size - 1) / group_size;
  // the fp32 checks on the groups' shape ([NB, NG, 16]); the compact tensors' dtypes checked here
  const at::Tensor shape_only = at::empty({num_blocks, num_groups, COLS}, x.options().dtype(at::kFloat).device(at::kMeta));
  check_args(name, x, codes, bits, shape_only, out_features, group_size);
  if (scale_subs.has_value())
    TORCH_CHECK(scale_subs->sizes() == shape_only.sizes() && scale_subs->scalar_type() == at::kChar && scale_subs->is_contiguous(),
                name, ": scale_subs must be contiguous int8 [NB, ceil(K / group_size) = ", num_groups, ", 16]");
  TORCH_CHECK(scale_supers.dim() == 3 && scale_supers.scalar_type() == at::kHalf && scale_supers.is_contiguous() &&
                  scale_supers.size(0) == num_blocks && scale_supers.size(2) == COLS && scale_supers.size(1) > 0 &&
                  num_groups % scale_supers.size(1) == 0 && (scale_subs.has_value() || scale_supers.size(1) == num_groups),
              name, ": scale_supers must be contiguous fp16 [NB, NG / R, 16] (R = 1 without scale_subs)");
  const int64_t num_supers = scale_supers.size(1);
  if (offset_supers.has_value())
    TORCH_CHECK(offset_supers->sizes() == scale_supers.sizes() && offset_supers->scalar_type() == at::kHalf &&
                    offset_supers->is_contiguous() && (offset_subs.has_value() || implied_offset != 0),
                name, ": offset_supers must be shaped like scale_supers, with offset_subs or an implied offset");
  if (offset_subs.has_value())
    TORCH_CHECK(offset_subs->sizes() == shape_only.sizes() && offset_subs->scalar_type() == at::kChar && offset_subs->is_contiguous() &&
                    implied_offset == 0,
                name, ": offset_subs must be contiguous int8 [NB, NG, 16], without an implied offset");
  TORCH_CHECK(implied_offset >= -128 && implied_offset <= 127, name, ": implied_offset is an int8 factor, got ", implied_offset);
  const float* bias = checked_bias(name, bias_f32, num_blocks);
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
#if ZSERVE_HAS_GEMM_WIDEN
  Weights first{codes.data_ptr<uint8_t>(), nullptr, nullptr, group_size};
  first.scale_supers = reinterpret_cast<const c10::Half*>(scale_supers.data_ptr());
  first.scale_subs = scale_subs.has_value() ? scale_subs->data_ptr<int8_t>() : nullptr;
  first.offset_supers = offset_supers.has_value() ? reinterpret_cast<const c10::Half*>(offset_supers->data_ptr()) : first.scale_supers;
  first.offset_subs = offset_subs.has_value() ? offset_subs->data_ptr<int8_t>() : nullptr;
  first.implied_offset = static_cast<int32_t>(implied_offset);
  first.R = num_groups / num_supers;
  const WeightLayout layout{first, codes.numel() / num_blocks, num_groups, num_supers};
  if (bits == 4) {
    run_dtype<Codes::NIBBLES>(x, layout, num_blocks, out_features, bias, out);
  } else if (bits == 6) {
    run_dtype<Codes::SIX>(x, layout, num_blocks, out_features, bias, out);
  } else {
    run_dtype<Codes::INT8>(x, layout, num_blocks, out_features, bias, out);
  }
#endif
  return out;
}

at::Tensor gemm_int8_dot(const at::Tensor& x, const at::Tensor& w_quads, const at::Tensor& scales, const c10::optional<at::Tensor>& offsets,
                         int64_t out_features, const c10::optional<at::Tensor>& bias_f32, int64_t group_size) {
  return gemm_dot<Codes::INT8>("gemm_int8_dot", x, w_quads, scales, offsets, out_features, bias_f32, group_size);
}

at::Tensor gemm_int4_dot(const at::Tensor& x, const at::Tensor& w_nibbles, const at::Tensor& scales, const c10::optional<at::Tensor>& offsets,
                         int64_t out_features, const c10::optional<at::Tensor>& bias_f32, int64_t group_size) {
  return gemm_dot<Codes::NIBBLES>("gemm_int4_dot", x, w_nibbles, scales, offsets, out_features, bias_f32, group_size);
}

// The quantizer alone (tests hold it to layers/int8_activations.py): (xq, s, the sums of xq over each 16 k).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(gemm_int8_dot_supported(), "quantize_activations: this build has no AVX2 kernel");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.size(1) % ACT_BLOCK == 0,
              "quantize_activations: x must be contiguous float32 [M, K], K a multiple of 32");
#if ZSERVE_HAS_GEMM_WIDEN
  QuantizedRows rows = quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), x.options());
  return {rows.q, rows.scales, rows.sums16};
#else
  return {};
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gemm_int8_dot_supported() -> bool", &gemm_int8_dot_supported);
  m.def("gemm_int8_dot_instruction() -> str", &gemm_int8_dot_instruction);
  m.def("gemm_int8_dot_amx_granted() -> bool", &gemm_int8_dot_amx_granted);
  m.def("gemm_int8_dot_bf16_tile_rows() -> int", &gemm_int8_dot_bf16_tile_rows);
  m.def("gemm_int8_dot(Tensor x, Tensor w_quads, Tensor scales, Tensor? offsets, int out_features, Tensor? bias_f32, int group_size) -> Tensor",
        &gemm_int8_dot);
  m.def("gemm_int4_dot(Tensor x, Tensor w_nibbles, Tensor scales, Tensor? offsets, int out_features, Tensor? bias_f32, int group_size) -> Tensor",
        &gemm_int4_dot);
  m.def("gemm_dot_compact(Tensor x, Tensor codes, int bits, Tensor scale_supers, Tensor? scale_subs, Tensor? offset_supers, "
        "Tensor? offset_subs, int out_features, Tensor? bias_f32, int group_size, int implied_offset=0) -> Tensor", &gemm_dot_compact);
  m.def("quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor)", &quantize_activations);
}
