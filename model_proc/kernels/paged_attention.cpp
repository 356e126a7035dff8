// Paged attention on CPU that reads the KV pages in place.
//
// zserve::paged_attention(q, k_cache, v_cache, out, req_token_starts, req_extend_lens,
//                         req_cached_lens, req_page_starts, page_ids, page_size, scale,
//                         sliding_window, logit_softcap)
//
//   q, out      [T, h, d]        this step's queries (last dim contiguous); out written only at
//                                the tokens of the listed requests
//   k/v_cache   [kvh, slots, d]  contiguous; slot = page_id * page_size + offset
//   req_*       int64[R]         per request: first token in q, new tokens, tokens already cached,
//                                first entry in page_ids
//   page_ids    int64[...]       every request's pages, in position order
//
// Token t of request r (position p = cached + t) attends to positions 0..p of that request, or,
// with sliding_window W > 0, to positions p - W + 1 .. p (the W newest, as transformers' sliding
// mask `kv_idx > q_idx - W`). A work item starts its walk at the first key any of its rows sees,
// so a long context costs O(W) per token; pages before it are not read (they stay allocated).
// With logit_softcap c > 0, each scaled score s becomes c * tanh(s / c) (Gemma 2) before the softmax.
// Work items are (request, kv head, block of QUERY_BLOCK new tokens); each walks its pages in
// tiles of KEY_TILE keys with an online softmax, fp32 throughout, and writes its output rows
// once in q's dtype. In bf16 the probabilities are rounded to bf16 before they weight V, as in
// torch's CPU SDPA. Items are handed out through an atomic counter (largest first) inside
// one at::parallel_for, so a long prefill row does not leave the other threads idle.
//
// zserve::paged_attention_int8(q, k_cache, v_cache, k_scales, v_scales, out, ...as above)
//
//   k/v_cache   int8 [kvh, slots, d]   an int8 KV cache (--kv-cache-dtype int8): row (head, slot) holds
//   k/v_scales  bf16 [kvh, slots]      round(x / scale), scale = bf16(max|x| / 127) of that row
//
// The same walk; each key and value row is widened to fp32 times its scale as it enters the tile
// (cpu_math.h's widen_int8_row: AVX-512, AVX2 or scalar, one rounded product each), so the dot
// products and the softmax are those of the 16-bit cache's path over the dequantized rows, and
// the pages read are half the bytes (plus 2 per row for the scale). Except where the build has
// AVX512-VNNI or AVX2, for a request decoding one token at head_dim 64 or 128 (attend_int8_decode):
// its query rows are quantized to int8 once and scored against the int8 keys as exact integer dot
// products, 16 keys at a time (int8_attention.h; cpu_isa.py's int8_decode_instruction says where).
//
// zserve::paged_attention over fp8 caches (--kv-cache-dtype fp8_e4m3 / fp8_e5m2: k/v_cache float8_e4m3fn or
// float8_e5m2 [kvh, slots, d], one byte a value, scale 1.0), q and out fp32 or bf16: the same walk; each row is
// widened to fp32 as it enters the tile (cpu_math.h's widen_fp8_row: exact), so the output equals the 16-bit
// path's over the rows in fp32 bit for bit. A request decoding one token at head_dim 64 or 128 takes
// attend_fp8_decode: the same arithmetic (bit for bit again), its tile's rows fetched at once and, with AVX-512,
// its values widened in registers.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "cpu_math.h"
#include "fp8_attention.h"
#include "int8_attention.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t QUERY_BLOCK = 16;
constexpr int64_t KEY_TILE = 64;
constexpr int64_t PREFETCH_PAGES = 2;  // how far ahead of the page being read its successors are fetched
constexpr float NEG_BIG = -1e30f;  // "no score yet": finite, so exp(NEG_BIG - m) is 0, not NaN

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline void store(float x, float* dst) { *dst = x; }
inline void store(float x, c10::BFloat16* dst) { *dst = c10::BFloat16(x); }

// exp for x <= 0 (scores minus their running max); exactly 0 below -87 (NEG_BIG - m lands
// there: "no score yet", masked keys).
inline __attribute__((always_inline)) float exp_nonpos(float x) { return x < -87.0f ? 0.0f : zserve_cpu::exp_poly(x); }

#if defined(__AVX512F__)
// Lane i of the result = the sum of v[i]'s 16 lanes: a transpose-and-add tree (45 shuffles and
// adds for 16 sums, against ~8 dependent steps for each sum alone).
inline __m512 sum_each_of_16(const __m512* v) {
  __m512 w[8], x[4], y[2];
  for (int k = 0; k < 8; ++k) w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(w[2 * k]), b = _mm512_castps_pd(w[2 * k + 1]);
    x[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int k = 0; k < 2; ++k) {
    y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// Lane i of the result = the sum of v[i]'s 8 lanes (AVX2: three rounds of adds and shuffles).
inline __m256 sum_each_of_8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // [v0..v3 low halves | v0..v3 high halves], then v4..v7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

// scores[j] = q . keys[j] for j < n; keys fp32 [n, d] (d = D when D > 0). Returns the largest
// score (NEG_BIG if n is 0).
template <int64_t D>
inline float dot_keys(const float* __restrict q, const float* __restrict keys, int64_t n, int64_t d, float* __restrict scores) {
  const int64_t dd = D > 0 ? D : d;
  int64_t j = 0;
  float best = NEG_BIG;
#if defined(__AVX512F__)
  if constexpr (D > 0 && D % 16 == 0) {
    constexpr int64_t C = D / 16;
    __m512 qv[C];
    for (int64_t c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
    __m512 best_v = _mm512_set1_ps(NEG_BIG);
    for (; j + 16 <= n; j += 16) {
      __m512 v[16];
      for (int i = 0; i < 16; ++i) {
        const float* kr = keys + (j + i) * D;
        __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
        for (int64_t c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), acc);
        v[i] = acc;
      }
      const __m512 sums = sum_each_of_16(v);
      _mm512_storeu_ps(scores + j, sums);
      best_v = _mm512_max_ps(best_v, sums);
    }
    best = _mm512_reduce_max_ps(best_v);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (D > 0 && D % 8 == 0) {  // 8 keys at a time, q read from L1 (16 ymm registers hold no more)
    constexpr int64_t C = D / 8;
    __m256 best_v = _mm256_set1_ps(NEG_BIG);
    for (; j + 8 <= n; j += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm256_setzero_ps();
      for (int64_t c = 0; c < C; ++c) {
        const __m256 qc = _mm256_loadu_ps(q + 8 * c);
        for (int i = 0; i < 8; ++i) v[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(keys + (j + i) * D + 8 * c), v[i]);
      }
      const __m256 sums = sum_each_of_8(v);
      _mm256_storeu_ps(scores + j, sums);
      best_v = _mm256_max_ps(best_v, sums);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, best_v);
    for (const float x : lanes) best = std::max(best, x);
  }
#endif
  for (; j < n; ++j) {
    const float* __restrict kr = keys + j * dd;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t x = 0; x < dd; ++x) dot += q[x] * kr[x];
    scores[j] = dot;
    best = std::max(best, dot);
  }
  return best;
}

template <typename KV>
inline void prefetch_page(const KV* k, const KV* v, int64_t num_bytes) {
  for (int64_t b = 0; b < num_bytes; b += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(k) + b);
    __builtin_prefetch(reinterpret_cast<const char*>(v) + b);
  }
}

struct Item {
  int64_t req, kv_head, q_lo, q_hi, cost;
};

struct Args {
  int64_t num_heads, num_kv_heads, head_dim, page_size;
  int64_t q_stride_t, q_stride_h, out_stride_t, out_stride_h;
  int64_t kv_stride_h;  // slots * d
  float scale;
  int64_t window;  // 0: full causal
  float softcap;   // 0: none
  const int64_t *token_starts, *extend_lens, *cached_lens, *page_starts, *page_ids;
  const c10::BFloat16 *k_scales = nullptr, *v_scales = nullptr;  // [kvh, slots] with an int8 cache (KV = int8_t)
};

// One cache row into fp32: a copy or widening of a 16-bit row, or int8 times the row's scale.
template <typename KV>
inline void load_row(const KV* __restrict src, const c10::BFloat16* scales, int64_t slot, float* __restrict dst,
                     int64_t d) {
  if constexpr (std::is_same_v<KV, int8_t>) {
    zserve_cpu::widen_int8_row(src, static_cast<float>(scales[slot]), dst, d);
  } else if constexpr (sizeof(KV) == 1) {  // fp8, scale 1.0
    zserve_cpu::widen_fp8_row(src, dst, d);
  } else {
    zserve_cpu::widen_row(src, dst, d);
  }
}

// One row's online-softmax step over a tile: its scores sr[lo, num_seen) and their largest, `tile_max`
// (with `softcap` > 0 both are capped here first). On return sr[0, KEY_TILE) holds exp(score - new max)
// (0 outside [lo, num_seen)), m and l the row's running max and sum; returns exp(old max - new max), the
// factor the row's accumulator is rescaled by.
template <typename T>
inline float softmax_step(float* __restrict sr, int64_t lo, int64_t num_seen, float tile_max, float softcap, float& m, float& l) {
  if (softcap > 0.0f) {  // c * tanh(s / c) is increasing, so it maps the max to the new max
    const float c = softcap, inv_c = 1.0f / softcap;
    for (int64_t j = lo; j < num_seen; ++j) sr[j] = c * std::tanh(sr[j] * inv_c);
    tile_max = c * std::tanh(tile_max * inv_c);
  }
  for (int64_t j = 0; j < lo; ++j) sr[j] = NEG_BIG;
  for (int64_t j = num_seen; j < KEY_TILE; ++j) sr[j] = NEG_BIG;  // a fixed trip count vectorizes
  const float new_max = std::max(m, tile_max);
  const float alpha = exp_nonpos(m - new_max);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < KEY_TILE; ++j) {
    sr[j] = exp_nonpos(sr[j] - new_max);
    sum += sr[j];
  }
  l = l * alpha + sum;
  m = new_max;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    // torch's CPU flash attention (SDPA, what transformers runs) multiplies V by these
    // exponentials rounded to the input dtype, after summing them in fp32; so do we
#pragma omp simd
    for (int64_t j = 0; j < KEY_TILE; ++j) sr[j] = zserve_cpu::round_to_bf16(sr[j]);
  }
  return alpha;
}

// One row's accumulator ar (fp32 [d]) = ar * alpha + sum_{lo <= j < hi} p[j] * values[j] (values fp32 [., d], the
// tile's rows), in this order: where D is known the accumulator stays in registers across the tile.
template <int64_t D>
inline void add_values_row(float* __restrict ar, float alpha, const float* __restrict p, const float* __restrict values,
                           int64_t lo, int64_t hi, int64_t d) {
#if defined(__AVX512F__)
  if constexpr (D > 0 && D % 16 == 0) {
    constexpr int64_t C = D / 16;
    __m512 local[C];
    const __m512 alpha_v = _mm512_set1_ps(alpha);
    for (int64_t c = 0; c < C; ++c) local[c] = _mm512_mul_ps(_mm512_loadu_ps(ar + 16 * c), alpha_v);
    for (int64_t j = lo; j < hi; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* __restrict vr = values + j * D;
      for (int64_t c = 0; c < C; ++c) local[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16 * c), local[c]);
    }
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(ar + 16 * c, local[c]);
    return;
  }
#endif
  if constexpr (D > 0) {
    float local[D];
#pragma omp simd
    for (int64_t x = 0; x < D; ++x) local[x] = ar[x] * alpha;
    for (int64_t j = lo; j < hi; ++j) {
      const float pj = p[j];
      const float* __restrict vr = values + j * D;
#pragma omp simd
      for (int64_t x = 0; x < D; ++x) local[x] += pj * vr[x];
    }
#pragma omp simd
    for (int64_t x = 0; x < D; ++x) ar[x] = local[x];
  } else {
#pragma omp simd
    for (int64_t x = 0; x < d; ++x) ar[x] *= alpha;
    for (int64_t j = lo; j < hi; ++j) {
      const float pj = p[j];
      const float* __restrict vr = values + j * d;
#pragma omp simd
      for (int64_t x = 0; x < d; ++x) ar[x] += pj * vr[x];
    }
  }
}

// D: head_dim when known at compile time (64, 128: rows stay in registers), else 0 (a.head_dim).
// T: q's and out's dtype; KV: the cache's (T, or int8_t with a.k_scales / a.v_scales).
template <typename T, typename KV, int64_t D>
void attend(const Args& a, const Item& it, const T* q, const KV* k_cache, const KV* v_cache, T* out,
            std::vector<float>& scratch) {
  const int64_t d = D > 0 ? D : a.head_dim, group = a.num_heads / a.num_kv_heads;
  const int64_t num_q = it.q_hi - it.q_lo, rows = num_q * group;  // row = token * group + head in group
  const int64_t cached = a.cached_lens[it.req], token0 = a.token_starts[it.req] + it.q_lo;
  const int64_t first_pos = cached + it.q_lo, num_keys = cached + it.q_hi, page_size = a.page_size;
  // the first key any row of this item sees: with a window, the oldest key of its first row
  const int64_t key_start = a.window > 0 ? std::max<int64_t>(0, first_pos - a.window + 1) : 0;
  const int64_t* pages = a.page_ids + a.page_starts[it.req];

  scratch.resize(2 * rows * d + 2 * rows + rows * KEY_TILE + 2 * KEY_TILE * d);
  float* __restrict qf = scratch.data();       // [rows, d], pre-scaled
  float* __restrict acc = qf + rows * d;       // [rows, d]
  float* __restrict m = acc + rows * d;        // [rows] running max
  float* __restrict l = m + rows;              // [rows] running sum
  float* __restrict s = l + rows;              // [rows, KEY_TILE] scores, then probabilities
  float* __restrict kf = s + rows * KEY_TILE;  // [KEY_TILE, d] this tile's keys in fp32
  float* __restrict vf = kf + KEY_TILE * d;    // [KEY_TILE, d] values

  for (int64_t t = 0; t < num_q; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = q + (token0 + t) * a.q_stride_t + (it.kv_head * group + g) * a.q_stride_h;
      float* dst = qf + (t * group + g) * d;
#pragma omp simd
      for (int64_t x = 0; x < d; ++x) dst[x] = to_float(src[x]) * a.scale;
    }
  }
  std::fill(acc, acc + rows * d, 0.0f);
  std::fill(m, m + rows, NEG_BIG);
  std::fill(l, l + rows, 0.0f);

  const KV* k_head = k_cache + it.kv_head * a.kv_stride_h;
  const KV* v_head = v_cache + it.kv_head * a.kv_stride_h;
  const int64_t num_slots = a.kv_stride_h / d;
  const c10::BFloat16* k_scale_head = a.k_scales != nullptr ? a.k_scales + it.kv_head * num_slots : nullptr;
  const c10::BFloat16* v_scale_head = a.v_scales != nullptr ? a.v_scales + it.kv_head * num_slots : nullptr;
  const int64_t page_bytes = page_size * d * static_cast<int64_t>(sizeof(KV));
  int64_t page_idx = key_start / page_size, offset = key_start % page_size;  // of position k0 + j, walked without a division per key
  // pages are scattered: the hardware prefetcher stops at each one's end, so ask for the first
  // pages now and, at each page start, for the page PREFETCH_PAGES ahead
  for (int64_t p = page_idx; p <= page_idx + PREFETCH_PAGES && p * page_size < num_keys; ++p) {
    prefetch_page(k_head + pages[p] * page_size * d, v_head + pages[p] * page_size * d, page_bytes);
  }
  for (int64_t k0 = key_start; k0 < num_keys; k0 += KEY_TILE) {
    const int64_t num_tile = std::min(KEY_TILE, num_keys - k0);
    for (int64_t j = 0; j < num_tile; ++j) {
      const int64_t slot = pages[page_idx] * page_size + offset;
      const int64_t ahead = page_idx + PREFETCH_PAGES;
      if (offset == 0 && k0 + j > key_start && ahead * page_size < num_keys) {
        prefetch_page(k_head + pages[ahead] * page_size * d, v_head + pages[ahead] * page_size * d, page_bytes);
      }
      if (++offset == page_size) offset = 0, ++page_idx;
      load_row(k_head + slot * d, k_scale_head, slot, kf + j * d, d);
      load_row(v_head + slot * d, v_scale_head, slot, vf + j * d, d);
    }
    for (int64_t row = 0; row < rows; ++row) {
      // tile keys [lo, num_seen) are this row's: positions up to its own, and, with a window,
      // from pos - W + 1 on; none of this tile when its token comes before k0
      const int64_t pos = first_pos + row / group;
      const int64_t num_seen = std::min(num_tile, pos - k0 + 1);
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1 - k0) : 0;
      if (num_seen <= lo) continue;
      const float* __restrict qr = qf + row * d;
      float* __restrict sr = s + row * KEY_TILE;
      const float tile_max = dot_keys<D>(qr, kf + lo * d, num_seen - lo, d, sr + lo);
      const float alpha = softmax_step<T>(sr, lo, num_seen, tile_max, a.softcap, m[row], l[row]);
      add_values_row<D>(acc + row * d, alpha, sr, vf, lo, num_seen, d);
    }
  }
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / group, g = row % group;
    T* dst = out + (token0 + t) * a.out_stride_t + (it.kv_head * group + g) * a.out_stride_h;
    const float* ar = acc + row * d;
    const float inv = 1.0f / l[row];  // l >= 1: the row's max score contributes exp(0)
    for (int64_t x = 0; x < d; ++x) store(ar[x] * inv, dst + x);
  }
}

// query heads per KV head the decode walks (attend_fp8_decode, attend_int8_decode) take
constexpr int64_t MAX_DECODE_ROWS = 64;

#if defined(__AVX512F__)
// acc[b] (fp32 [D], b < RB) = acc[b] * alpha[b] + sum_{j < n} w[b][j] * values[j] for RB query rows, w[b] = weights +
// b * KEY_TILE, values fp8 [D] widened in registers (widen_fp8_16_unscaled: e4m3 times 2^-8, so its weights come in
// times 2^8, exactly) once for the RB rows; the D / 16 * RB accumulators stay in registers. Each row's sums are
// add_values_row's, term for term: (w * 2^8) * (v * 2^-8) is the same product as w * v, and every FMA rounds once.
template <typename Fp8, int64_t D, int RB>
inline void add_fp8_values(const uint8_t* const* values, const float* weights, int64_t n, const float* alpha, float* acc) {
  constexpr int64_t C = D / 16;
  __m512 r[RB][C];
  for (int b = 0; b < RB; ++b) {
    const __m512 a = _mm512_set1_ps(alpha[b]);
    for (int64_t c = 0; c < C; ++c) r[b][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + b * D + 16 * c), a);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 w[RB];
    for (int b = 0; b < RB; ++b) w[b] = _mm512_set1_ps(weights[b * KEY_TILE + j]);
    for (int64_t c = 0; c < C; ++c) {
      const __m512 v = zserve_cpu::widen_fp8_16_unscaled<Fp8>(values[j] + 16 * c);
      for (int b = 0; b < RB; ++b) r[b][c] = _mm512_fmadd_ps(w[b], v, r[b][c]);
    }
  }
  for (int b = 0; b < RB; ++b)
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(acc + b * D + 16 * c, r[b][c]);
}
#endif

// A decode item (a request's one new token: `group` query rows, at most MAX_DECODE_ROWS) over an fp8 cache: attend()'s
// walk and arithmetic, output bit for bit the same, arranged for one-byte rows. The tile's rows are asked for all at
// once before any is read (one at a time, each row's miss was waited for in turn: the walk spent more time waiting
// than computing), pages are fetched PREFETCH_PAGES * 2 ahead (twice the pages of a 16-bit cache: the same bytes), the
// keys widen once into the tile buffer for every row's dot products, and with AVX-512 the values widen in registers
// for a few rows' accumulators at a time (add_fp8_values) instead of through the buffer.
template <typename T, typename Fp8, int64_t D>
void attend_fp8_decode(const Args& a, const Item& it, const T* q, const Fp8* k_cache, const Fp8* v_cache, T* out,
                       std::vector<float>& scratch) {
  const int64_t rows = a.num_heads / a.num_kv_heads;  // row = query head in the KV head's group
  const int64_t token = a.token_starts[it.req] + it.q_lo;
  const int64_t pos = a.cached_lens[it.req] + it.q_lo, num_keys = pos + 1, page_size = a.page_size;
  // every row is this token's, so with a window the walk starts at its oldest key and sees every key after
  const int64_t key_start = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  const int64_t* pages = a.page_ids + a.page_starts[it.req];

  scratch.resize(2 * rows * D + 2 * rows + rows * KEY_TILE + 2 * KEY_TILE * D);
  float* __restrict qf = scratch.data();        // [rows, D], pre-scaled
  float* __restrict acc = qf + rows * D;        // [rows, D]
  float* __restrict m = acc + rows * D;         // [rows] running max
  float* __restrict l = m + rows;               // [rows] running sum
  float* __restrict s = l + rows;               // [rows, KEY_TILE] scores, then probabilities
  float* __restrict kf = s + rows * KEY_TILE;   // [KEY_TILE, D] this tile's keys in fp32
  float* __restrict vf = kf + KEY_TILE * D;     // [KEY_TILE, D] its values (without AVX-512)
  float alpha[MAX_DECODE_ROWS];
  const uint8_t* k_rows[KEY_TILE];
  const uint8_t* v_rows[KEY_TILE];

  for (int64_t g = 0; g < rows; ++g) {
    const T* src = q + token * a.q_stride_t + (it.kv_head * rows + g) * a.q_stride_h;
#pragma omp simd
    for (int64_t x = 0; x < D; ++x) qf[g * D + x] = to_float(src[x]) * a.scale;
  }
  std::fill(acc, acc + rows * D, 0.0f);
  std::fill(m, m + rows, NEG_BIG);
  std::fill(l, l + rows, 0.0f);

  const uint8_t* k_head = reinterpret_cast<const uint8_t*>(k_cache + it.kv_head * a.kv_stride_h);
  const uint8_t* v_head = reinterpret_cast<const uint8_t*>(v_cache + it.kv_head * a.kv_stride_h);
  constexpr int64_t ahead = 2 * PREFETCH_PAGES;
  const int64_t num_pages = (num_keys + page_size - 1) / page_size;
  const auto prefetch = [&](int64_t p) {
    prefetch_page(k_head + pages[p] * page_size * D, v_head + pages[p] * page_size * D, page_size * D);
  };
  int64_t page_idx = key_start / page_size, offset = key_start % page_size;
  for (int64_t p = page_idx; p <= page_idx + ahead && p < num_pages; ++p) prefetch(p);
  for (int64_t k0 = key_start; k0 < num_keys; k0 += KEY_TILE) {
    const int64_t num_tile = std::min(KEY_TILE, num_keys - k0);
    for (int64_t j = 0; j < num_tile; ++j) {
      if (offset == 0 && k0 + j > key_start && page_idx + ahead < num_pages) prefetch(page_idx + ahead);
      const int64_t slot = pages[page_idx] * page_size + offset;
      if (++offset == page_size) offset = 0, ++page_idx;
      k_rows[j] = k_head + slot * D, v_rows[j] = v_head + slot * D;
      for (int64_t b = 0; b < D; b += 64) __builtin_prefetch(k_rows[j] + b), __builtin_prefetch(v_rows[j] + b);
    }
#if ZSERVE_FP8_DECODE_BF16
    if constexpr (std::is_same_v<T, c10::BFloat16>) {  // scored from the bytes (fp8_attention.h)
      namespace fa = zserve_fp8_attention;
      const int64_t num_blocks = (num_tile + fa::KEYS - 1) / fa::KEYS;
      for (int64_t j = num_tile; j < num_blocks * fa::KEYS; ++j) k_rows[j] = k_rows[0];  // scored, then masked
      const T* q_rows = q + token * a.q_stride_t + it.kv_head * rows * a.q_stride_h;
      for (int64_t blk = 0; blk < num_blocks; ++blk) {
        fa::score_block<Fp8, D>(k_rows + blk * fa::KEYS, q_rows, a.q_stride_h, rows, a.scale, s + blk * fa::KEYS, KEY_TILE);
      }
      for (int64_t g = 0; g < rows; ++g) {
        float* __restrict sr = s + g * KEY_TILE;
        alpha[g] = softmax_step<T>(sr, 0, num_tile, zserve_int8_attention::max_of(sr, num_tile), a.softcap, m[g], l[g]);
      }
    } else
#endif
    {
      for (int64_t j = 0; j < num_tile; ++j) zserve_cpu::widen_fp8_row(reinterpret_cast<const Fp8*>(k_rows[j]), kf + j * D, D);
      for (int64_t g = 0; g < rows; ++g) {
        float* __restrict sr = s + g * KEY_TILE;
        const float tile_max = dot_keys<D>(qf + g * D, kf, num_tile, D, sr);
        alpha[g] = softmax_step<T>(sr, 0, num_tile, tile_max, a.softcap, m[g], l[g]);
      }
    }
#if defined(__AVX512F__)
    constexpr float V_SCALE = zserve_cpu::FP8_HALF_SCALE<Fp8>;  // what add_fp8_values' widened values lack
    if constexpr (V_SCALE != 1.0f) {
      for (int64_t g = 0; g < rows; ++g) {
#pragma omp simd
        for (int64_t j = 0; j < num_tile; ++j) s[g * KEY_TILE + j] *= V_SCALE;
      }
    }
    constexpr int64_t RB = D == 64 ? 4 : 3;  // rows per pass: RB * D / 16 accumulators in the 32 zmm registers
    for (int64_t b = 0; b < rows; b += RB) {
      const int64_t num = std::min<int64_t>(RB, rows - b);
      const float* w = s + b * KEY_TILE;
      if (num == 4) {
        add_fp8_values<Fp8, D, 4>(v_rows, w, num_tile, alpha + b, acc + b * D);
      } else if (num == 3) {
        add_fp8_values<Fp8, D, 3>(v_rows, w, num_tile, alpha + b, acc + b * D);
      } else if (num == 2) {
        add_fp8_values<Fp8, D, 2>(v_rows, w, num_tile, alpha + b, acc + b * D);
      } else {
        add_fp8_values<Fp8, D, 1>(v_rows, w, num_tile, alpha + b, acc + b * D);
      }
    }
#else
    for (int64_t j = 0; j < num_tile; ++j) zserve_cpu::widen_fp8_row(reinterpret_cast<const Fp8*>(v_rows[j]), vf + j * D, D);
    for (int64_t g = 0; g < rows; ++g) add_values_row<D>(acc + g * D, alpha[g], s + g * KEY_TILE, vf, 0, num_tile, D);
#endif
  }
  for (int64_t g = 0; g < rows; ++g) {
    T* dst = out + token * a.out_stride_t + (it.kv_head * rows + g) * a.out_stride_h;
    const float inv = 1.0f / l[g];  // l >= 1: the row's max score contributes exp(0)
    for (int64_t x = 0; x < D; ++x) store(acc[g * D + x] * inv, dst + x);
  }
}

#if ZSERVE_INT8_DECODE
static_assert(KEY_TILE == zserve_int8_attention::TILE, "int8_attention.h's weights are rows of KEY_TILE");

// A decode item (a request's one new token: `group` query rows, at most MAX_DECODE_ROWS) over an int8 cache, in a
// build with AVX512-VNNI or AVX2 (int8_attention.h): the rows quantized to int8 once, each tile's keys read as
// int8 into exact int32 scores, its values widened as they are summed; attend()'s walk, tiles and online softmax.
template <typename T, int64_t D>
void attend_int8_decode(const Args& a, const Item& it, const T* q, const int8_t* k_cache, const int8_t* v_cache, T* out,
                        std::vector<float>& scratch) {
  namespace ia = zserve_int8_attention;
  const int64_t rows = a.num_heads / a.num_kv_heads;  // row = query head in the KV head's group
  const int64_t token = a.token_starts[it.req] + it.q_lo;
  const int64_t pos = a.cached_lens[it.req] + it.q_lo, num_keys = pos + 1, page_size = a.page_size;
  // every row is this token's, so with a window the walk starts at its oldest key and sees every key after
  const int64_t key_start = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  const int64_t* pages = a.page_ids + a.page_starts[it.req];

  scratch.resize(rows * D + 2 * rows + rows * KEY_TILE + KEY_TILE * D);
  float* __restrict acc = scratch.data();       // [rows, D]
  float* __restrict m = acc + rows * D;         // [rows] running max
  float* __restrict l = m + rows;               // [rows] running sum
  float* __restrict s = l + rows;               // [rows, KEY_TILE] scores, then probabilities times value scales
  float* __restrict values = s + rows * KEY_TILE;  // [KEY_TILE, D]: AVX2's tile of widened value rows
  alignas(64) int8_t codes[2 * MAX_DECODE_ROWS * D];  // the rows quantized [rows, D], then their magnitudes
  float q_scale[MAX_DECODE_ROWS], alpha[MAX_DECODE_ROWS];
  int32_t correction[MAX_DECODE_ROWS];          // 128 * sum(codes): VPDPBUSD's keys enter as unsigned k + 128
  const ia::QueryCodes query{codes, q_scale, correction, rows};
  const int8_t* k_rows[KEY_TILE];               // the tile's rows and their scales
  const int8_t* v_rows[KEY_TILE];
  float k_sc[KEY_TILE], v_sc[KEY_TILE];

  for (int64_t g = 0; g < rows; ++g) {
    const T* src = q + token * a.q_stride_t + (it.kv_head * rows + g) * a.q_stride_h;
    alignas(64) float qf[D];
#pragma omp simd
    for (int64_t x = 0; x < D; ++x) qf[x] = to_float(src[x]) * a.scale;
    q_scale[g] = zserve_cpu::quantize_int8_row(qf, codes + g * D, D);
    int32_t sum = 0;
    for (int64_t x = 0; x < D; ++x) {
      sum += codes[g * D + x];
      codes[(rows + g) * D + x] = static_cast<int8_t>(std::abs(codes[g * D + x]));
    }
    correction[g] = 128 * sum;
  }
  std::fill(acc, acc + rows * D, 0.0f);
  std::fill(m, m + rows, NEG_BIG);
  std::fill(l, l + rows, 0.0f);

  const int8_t* k_head = k_cache + it.kv_head * a.kv_stride_h;
  const int8_t* v_head = v_cache + it.kv_head * a.kv_stride_h;
  const int64_t num_slots = a.kv_stride_h / D;
  const c10::BFloat16* k_scale_head = a.k_scales + it.kv_head * num_slots;
  const c10::BFloat16* v_scale_head = a.v_scales + it.kv_head * num_slots;
  // pages are scattered: ask for the first pages now and, at each page start, for the page `ahead` pages
  // on (its rows and their scales)
  constexpr int64_t ahead = PREFETCH_PAGES;
  const int64_t num_pages = (num_keys + page_size - 1) / page_size;
  const auto prefetch = [&](int64_t p) {
    const int64_t first = pages[p] * page_size;
    prefetch_page(k_head + first * D, v_head + first * D, page_size * D);
    for (int64_t b = 0; b < page_size * int64_t(sizeof(c10::BFloat16)); b += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(k_scale_head + first) + b);
      __builtin_prefetch(reinterpret_cast<const char*>(v_scale_head + first) + b);
    }
  };
  int64_t page_idx = key_start / page_size, offset = key_start % page_size;
  for (int64_t p = page_idx; p <= page_idx + ahead && p < num_pages; ++p) prefetch(p);
  for (int64_t k0 = key_start; k0 < num_keys; k0 += KEY_TILE) {
    const int64_t num_tile = std::min(KEY_TILE, num_keys - k0);
    for (int64_t j = 0; j < num_tile; ++j) {
      if (offset == 0 && k0 + j > key_start && page_idx + ahead < num_pages) prefetch(page_idx + ahead);
      const int64_t slot = pages[page_idx] * page_size + offset;
      if (++offset == page_size) offset = 0, ++page_idx;
      k_rows[j] = k_head + slot * D, v_rows[j] = v_head + slot * D;
      k_sc[j] = static_cast<float>(k_scale_head[slot]), v_sc[j] = static_cast<float>(v_scale_head[slot]);
      // the tile's rows asked for now, all at once: read as they are scored and summed below, one at a
      // time, their misses would be waited for one after another
      for (int64_t b = 0; b < D; b += 64) __builtin_prefetch(k_rows[j] + b), __builtin_prefetch(v_rows[j] + b);
    }
    const int64_t num_blocks = (num_tile + ia::KEYS - 1) / ia::KEYS;
    for (int64_t j = num_tile; j < num_blocks * ia::KEYS; ++j) k_rows[j] = k_rows[0], k_sc[j] = 0.0f;  // read, then masked
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      ia::score_block<D>(k_rows + blk * ia::KEYS, k_sc + blk * ia::KEYS, query, s + blk * ia::KEYS);
    }
    for (int64_t g = 0; g < rows; ++g) {
      float* __restrict sr = s + g * KEY_TILE;
      const float tile_max = ia::max_of(sr, num_tile);
      alpha[g] = softmax_step<T>(sr, 0, num_tile, tile_max, a.softcap, m[g], l[g]);
      for (int64_t j = 0; j < num_tile; ++j) sr[j] *= v_sc[j];  // the value rows' scales, into their weights
    }
    ia::add_values_rows<D>(v_rows, s, num_tile, alpha, acc, rows, values);
  }
  for (int64_t g = 0; g < rows; ++g) {
    T* dst = out + token * a.out_stride_t + (it.kv_head * rows + g) * a.out_stride_h;
    const float inv = 1.0f / l[g];  // l >= 1: the row's max score contributes exp(0)
    for (int64_t x = 0; x < D; ++x) store(acc[g * D + x] * inv, dst + x);
  }
}
#endif

template <typename T, typename KV>
void run(const Args& a, const std::vector<Item>& items, const at::Tensor& q, const at::Tensor& k_cache,
         const at::Tensor& v_cache, at::Tensor& out) {
  const T* qp = q.data_ptr<T>();
  const KV* kp = k_cache.data_ptr<KV>();
  const KV* vp = v_cache.data_ptr<KV>();
  T* op = out.data_ptr<T>();
  const int64_t num_items = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(num_items, at::get_num_threads()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t w = begin; w < end; ++w) {  // one iteration per thread; each pulls items until none are left
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
#if ZSERVE_INT8_DECODE
        if constexpr (std::is_same_v<KV, int8_t>) {
          const bool decode = a.extend_lens[items[i].req] == 1 && a.num_heads / a.num_kv_heads <= MAX_DECODE_ROWS;
          if (decode && a.head_dim == 64) {
            attend_int8_decode<T, 64>(a, items[i], qp, kp, vp, op, scratch);
            continue;
          }
          if (decode && a.head_dim == 128) {
            attend_int8_decode<T, 128>(a, items[i], qp, kp, vp, op, scratch);
            continue;
          }
        }
#endif
        if constexpr (sizeof(KV) == 1 && !std::is_same_v<KV, int8_t>) {  // fp8
          const bool decode = a.extend_lens[items[i].req] == 1 && a.num_heads / a.num_kv_heads <= MAX_DECODE_ROWS;
          if (decode && a.head_dim == 64) {
            attend_fp8_decode<T, KV, 64>(a, items[i], qp, kp, vp, op, scratch);
            continue;
          }
          if (decode && a.head_dim == 128) {
            attend_fp8_decode<T, KV, 128>(a, items[i], qp, kp, vp, op, scratch);
            continue;
          }
        }
        if (a.head_dim == 64) {
          attend<T, KV, 64>(a, items[i], qp, kp, vp, op, scratch);
        } else if (a.head_dim == 128) {
          attend<T, KV, 128>(a, items[i], qp, kp, vp, op, scratch);
        } else {
          attend<T, KV, 0>(a, items[i], qp, kp, vp, op, scratch);
        }
      }
    }
  });
}

// An fp8 cache's call, by q's dtype and the cache's format.
void run_fp8(const Args& a, const std::vector<Item>& items, const at::Tensor& q, const at::Tensor& k_cache,
             const at::Tensor& v_cache, at::Tensor& out) {
  const bool e4m3 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  if (q.scalar_type() == at::kFloat) {
    e4m3 ? run<float, c10::Float8_e4m3fn>(a, items, q, k_cache, v_cache, out)
         : run<float, c10::Float8_e5m2>(a, items, q, k_cache, v_cache, out);
  } else if (q.scalar_type() == at::kBFloat16) {
    e4m3 ? run<c10::BFloat16, c10::Float8_e4m3fn>(a, items, q, k_cache, v_cache, out)
         : run<c10::BFloat16, c10::Float8_e5m2>(a, items, q, k_cache, v_cache, out);
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only, got ", q.scalar_type());
  }
}

// k_scales / v_scales: undefined for a cache of q's dtype or an fp8 one, bf16 [kvh, slots] for an int8 one
void attention_call(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_scales,
                    const at::Tensor& v_scales, at::Tensor out, const at::Tensor& token_starts, const at::Tensor& extend_lens,
                    const at::Tensor& cached_lens, const at::Tensor& page_starts, const at::Tensor& page_ids, int64_t page_size,
                    double scale, int64_t sliding_window, double logit_softcap) {
  const bool int8_cache = k_scales.defined();
  const bool fp8_cache = !int8_cache && (k_cache.scalar_type() == at::kFloat8_e4m3fn || k_cache.scalar_type() == at::kFloat8_e5m2);
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "paged_attention: q, out [T, h, d]; caches [kvh, slots, d]");
  if (int8_cache) {
    TORCH_CHECK(k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar && q.scalar_type() == out.scalar_type(),
                "paged_attention_int8: int8 caches, q and out of one dtype");
    for (const at::Tensor* t : {&k_scales, &v_scales}) {
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 2 && t->size(0) == k_cache.size(0) &&
                      t->size(1) == k_cache.size(1),
                  "paged_attention_int8: scales bf16 [kvh, slots], contiguous");
    }
  } else if (fp8_cache) {
    TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
                "paged_attention: fp8 caches of one format, q and out of one dtype");
  } else {
    TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
                "paged_attention: q, caches and out share one dtype");
  }
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: caches must be contiguous");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "paged_attention: head_dim must be contiguous");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && q.size(2) == k_cache.size(2) && out.sizes() == q.sizes(), "paged_attention: shape mismatch");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, "paged_attention: query heads must be a multiple of kv heads");
  for (const at::Tensor* t : {&token_starts, &extend_lens, &cached_lens, &page_starts, &page_ids}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->dim() == 1, "paged_attention: index tensors are contiguous int64[n]");
  }
  TORCH_CHECK(sliding_window >= 0 && logit_softcap >= 0.0, "paged_attention: sliding_window and logit_softcap must be >= 0");
  const int64_t num_reqs = token_starts.size(0);
  TORCH_CHECK(extend_lens.size(0) == num_reqs && cached_lens.size(0) == num_reqs && page_starts.size(0) == num_reqs, "paged_attention: per-request lengths differ");

  Args a{q.size(1), k_cache.size(0), q.size(2), page_size, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
         k_cache.stride(0), static_cast<float>(scale), sliding_window, static_cast<float>(logit_softcap), token_starts.data_ptr<int64_t>(), extend_lens.data_ptr<int64_t>(),
         cached_lens.data_ptr<int64_t>(), page_starts.data_ptr<int64_t>(), page_ids.data_ptr<int64_t>()};
  if (int8_cache) a.k_scales = k_scales.data_ptr<c10::BFloat16>(), a.v_scales = v_scales.data_ptr<c10::BFloat16>();
  // the slots a request reads must lie in the pool: a bad table would read outside the cache
  const int64_t num_pool_pages = k_cache.size(1) / page_size;
  TORCH_CHECK(page_size >= 1 && k_cache.size(1) % page_size == 0, "paged_attention: cache slots are not whole pages");
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t seq_len = a.cached_lens[r] + a.extend_lens[r], first = a.page_starts[r];
    const int64_t last = first + (seq_len + page_size - 1) / page_size;
    TORCH_CHECK(a.cached_lens[r] >= 0 && a.extend_lens[r] >= 0 && first >= 0 && last <= page_ids.size(0), "paged_attention: request ", r, " reads past page_ids");
    TORCH_CHECK(a.token_starts[r] >= 0 && a.token_starts[r] + a.extend_lens[r] <= q.size(0), "paged_attention: request ", r, " reads past q");
    for (int64_t i = first; i < last; ++i) {
      TORCH_CHECK(a.page_ids[i] >= 0 && a.page_ids[i] < num_pool_pages, "paged_attention: page id ", a.page_ids[i], " outside the pool");
    }
  }
  std::vector<Item> items;
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t lo = 0; lo < a.extend_lens[r]; lo += QUERY_BLOCK) {
      const int64_t hi = std::min(lo + QUERY_BLOCK, a.extend_lens[r]);
      const int64_t num_keys = a.cached_lens[r] + hi;  // keys the block's rows read, at most
      const int64_t read = sliding_window > 0 ? std::min(num_keys, sliding_window + hi - lo) : num_keys;
      for (int64_t h = 0; h < a.num_kv_heads; ++h) items.push_back({r, h, lo, hi, (hi - lo) * read});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  if (fp8_cache) {
    run_fp8(a, items, q, k_cache, v_cache, out);
    return;
  }
  if (q.scalar_type() == at::kFloat) {
    int8_cache ? run<float, int8_t>(a, items, q, k_cache, v_cache, out) : run<float, float>(a, items, q, k_cache, v_cache, out);
  } else if (q.scalar_type() == at::kBFloat16) {
    int8_cache ? run<c10::BFloat16, int8_t>(a, items, q, k_cache, v_cache, out)
               : run<c10::BFloat16, c10::BFloat16>(a, items, q, k_cache, v_cache, out);
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only, got ", q.scalar_type());
  }
}

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, at::Tensor out,
                     const at::Tensor& token_starts, const at::Tensor& extend_lens, const at::Tensor& cached_lens,
                     const at::Tensor& page_starts, const at::Tensor& page_ids, int64_t page_size, double scale,
                     int64_t sliding_window, double logit_softcap) {
  attention_call(q, k_cache, v_cache, at::Tensor(), at::Tensor(), out, token_starts, extend_lens, cached_lens, page_starts, page_ids,
                 page_size, scale, sliding_window, logit_softcap);
}

void paged_attention_int8(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_scales,
                          const at::Tensor& v_scales, at::Tensor out, const at::Tensor& token_starts, const at::Tensor& extend_lens,
                          const at::Tensor& cached_lens, const at::Tensor& page_starts, const at::Tensor& page_ids, int64_t page_size,
                          double scale, int64_t sliding_window, double logit_softcap) {
  TORCH_CHECK(k_scales.defined() && v_scales.defined(), "paged_attention_int8: scales required");
  attention_call(q, k_cache, v_cache, k_scales, v_scales, out, token_starts, extend_lens, cached_lens, page_starts, page_ids,
                 page_size, scale, sliding_window, logit_softcap);
}

}  // namespace

TORCH_LIBRARY(zserve, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor token_starts, Tensor extend_lens, "
        "Tensor cached_lens, Tensor page_starts, Tensor page_ids, int page_size, float scale, int sliding_window, "
        "float logit_softcap) -> ()");
  m.def("paged_attention_int8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor k_scales, Tensor v_scales, Tensor(a!) out, "
        "Tensor token_starts, Tensor extend_lens, Tensor cached_lens, Tensor page_starts, Tensor page_ids, int page_size, "
        "float scale, int sliding_window, float logit_softcap) -> ()");
}

TORCH_LIBRARY_IMPL(zserve, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_attention_int8", &paged_attention_int8);
}
