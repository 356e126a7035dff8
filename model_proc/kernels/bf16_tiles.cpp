// The int8 x int8 GEMM's many rows through bf16 tiles (AMX-BF16, oneDNN's matmul), for a CPU that
// has them: gemm_int8_dot.cpp hands a bf16 x of BF16_TILE_MIN_ROWS rows and more here when
// bf16_tiles_granted(); fewer rows, and fp16 or fp32 x, stay on its int8 paths.
//
// Why: a prefill's products of hundreds of rows are compute-bound, and there the exact int8
// contract (activations quantized per 32 k, every sub-block's int32 sum rescaled in fp32) costs
// the AMX-INT8 path a tile store and a vector rescale per 32 k: oneDNN's AMX-BF16 matmul on the
// weight in bf16 measured 1.7-2.7x faster at 256-1024 rows (benchmarks/bench_amx_gemm.py). The
// bf16 weight is not kept: each chunk of column blocks is decoded into one scratch of at most
// CHUNK_BYTES (threads splitting K in slabs), multiplied, and the scratch reused.
//
// Arithmetic: W = C * S + O as decode_block_bf16 computes it (the scales and offsets as the int8
// paths read them, Weights::group; C * S + O in fp32, rounded to bf16 once, to nearest even),
// then y = x @ W by oneDNN (bf16 products, fp32 sums, rounded to bf16 once); a bias is added to
// that bf16 result in fp32 and rounded again. This is x in bf16 times the weight rounded to bf16, the product a 16-bit model
// of the same weights computes (transformers on the dequantized file), not the int8 paths' result
// (activations quantized to int8 per 32 k): the two differ by those roundings. The path is chosen
// by the rows of the product only, so a prompt's prefill and its decode steps differ as a bf16 and
// an int8 model do; tests/model/test_bf16_tiles.py holds the decode to the reference bit for bit
// (within one bf16 rounding where the compiler fuses C * S + O) and the product to the bf16 matmul.
//
// The path needs AMX-BF16 (cpuid leaf 7, EDX bit 22) in a build with amx_int8 (so `--cpu-isa`
// without amx_int8 turns it off too) and the OS's grant of the tile data (amx_granted()).

#include "int8_dot.h"
#include "six_bit_codes.h"

#if ZSERVE_HAS_GEMM_WIDEN && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define ZSERVE_HAS_BF16_TILES 1
#include <cpuid.h>
#else
#define ZSERVE_HAS_BF16_TILES 0
#endif

namespace zserve_int8_dot {

#if ZSERVE_HAS_BF16_TILES

namespace {

constexpr int64_t CHUNK_BYTES = 16 << 20;  // the bf16 scratch of one chunk of column blocks

bool cpu_has_amx_bf16() {
  unsigned int a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && ((d >> 22) & 1u) != 0;
}

// fp32 -> bf16, rounded to nearest even (finite values: the decode makes no inf or NaN of finite codes). With
// AVX512-BF16 (every AMX-BF16 CPU has it) one VCVTNEPS2BF16, which also flushes fp32 denormals (|w| < 1.2e-38) to 0.
inline __m256i to_bf16(__m512 v) {
#if defined(__AVX512BF16__)
  return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// byte `i` of each 32-bit lane (one column's code at one k) as int32, minus `code_offset`
template <int SHIFT>
inline __m512i lane_codes(__m512i v, int32_t mask, int32_t code_offset) {
  return _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, SHIFT), _mm512_set1_epi32(mask)), _mm512_set1_epi32(code_offset));
}

struct GroupValues {
  __m512 scale, offset;
  bool has_offset;
  inline void store(int64_t k, __m512i codes, c10::BFloat16* out, int64_t ld) const {
    __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(codes), scale);
    if (has_offset) w = _mm512_add_ps(w, offset);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * ld), to_bf16(w));
  }
};

constexpr int64_t SLAB_K = 64;  // k per slab: whole loads of every kind of codes (4, 8 or 16 k)

// One column block's rows [k_begin, k_end) (16 columns) -> out[k * ld + j], bf16.
void decode_block_bf16(Codes kind, const Weights& w, int64_t k_begin, int64_t k_end, c10::BFloat16* out, int64_t ld) {
  const int64_t k_per_load = kind == Codes::NIBBLES ? 2 * QUAD : kind == Codes::SIX ? zserve_six_bit::K_PER_UNIT : QUAD;
  const int64_t load_bytes = kind == Codes::SIX ? zserve_six_bit::UNIT_BYTES : COLS * QUAD;
  GroupValues group{_mm512_setzero_ps(), _mm512_setzero_ps(), w.has_offsets()};
  int64_t current_group = -1;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += k_per_load) {
    if (k0 / w.G != current_group) {  // a group spans whole loads: G is 16, a multiple of 32, or K
      current_group = k0 / w.G;
      w.group(current_group, &group.scale, &group.offset);
    }
    const uint8_t* load = w.codes + (k0 / k_per_load) * load_bytes;
    if (kind == Codes::INT8) {  // quads of C + 128: byte i of lane j is k0 + i
      const __m512i v = _mm512_loadu_si512(load);
      group.store(k0 + 0, lane_codes<0>(v, 0xff, 128), out, ld);
      group.store(k0 + 1, lane_codes<8>(v, 0xff, 128), out, ld);
      group.store(k0 + 2, lane_codes<16>(v, 0xff, 128), out, ld);
      group.store(k0 + 3, lane_codes<24>(v, 0xff, 128), out, ld);
    } else if (kind == Codes::NIBBLES) {  // byte i: k0 + i in its low nibble, k0 + 4 + i in its high one
      const __m512i v = _mm512_loadu_si512(load);
      group.store(k0 + 0, lane_codes<0>(v, 0xf, 0), out, ld);
      group.store(k0 + 4, lane_codes<4>(v, 0xf, 0), out, ld);
      group.store(k0 + 1, lane_codes<8>(v, 0xf, 0), out, ld);
      group.store(k0 + 5, lane_codes<12>(v, 0xf, 0), out, ld);
      group.store(k0 + 2, lane_codes<16>(v, 0xf, 0), out, ld);
      group.store(k0 + 6, lane_codes<20>(v, 0xf, 0), out, ld);
      group.store(k0 + 3, lane_codes<24>(v, 0xf, 0), out, ld);
      group.store(k0 + 7, lane_codes<28>(v, 0xf, 0), out, ld);
    } else {  // 6-bit units of 16 k: quads of C + 32 for k0 + 4s + i (six_bit_codes.h)
      constexpr int64_t ROW = zserve_six_bit::ROW_BYTES;
      const __m512i low0 = _mm512_loadu_si512(load), low1 = _mm512_loadu_si512(load + ROW), high = _mm512_loadu_si512(load + 2 * ROW);
      const __m512i nibble = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
      const __m512i quads[4] = {
          _mm512_or_si512(_mm512_and_si512(low0, nibble), _mm512_and_si512(_mm512_slli_epi16(high, 4), top)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low0, 4), nibble), _mm512_and_si512(_mm512_slli_epi16(high, 2), top)),
          _mm512_or_si512(_mm512_and_si512(low1, nibble), _mm512_and_si512(high, top)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low1, 4), nibble), _mm512_and_si512(_mm512_srli_epi16(high, 2), top)),
      };
      const int32_t offset = zserve_six_bit::CODE_OFFSET;
      for (int s = 0; s < 4; ++s) {
        group.store(k0 + 4 * s + 0, lane_codes<0>(quads[s], 0xff, offset), out, ld);
        group.store(k0 + 4 * s + 1, lane_codes<8>(quads[s], 0xff, offset), out, ld);
        group.store(k0 + 4 * s + 2, lane_codes<16>(quads[s], 0xff, offset), out, ld);
        group.store(k0 + 4 * s + 3, lane_codes<24>(quads[s], 0xff, offset), out, ld);
      }
    }
  }
}

}  // namespace

bool bf16_tiles_granted() {
  static const bool granted = cpu_has_amx_bf16() && amx_granted();
  return granted;
}

// Threads split K in slabs; a slab goes block after block, so the two halves of each 64-byte line of
// out (two blocks' 16 bf16 of one k) are written while the line is still in cache.
void decode_blocks_bf16(Codes kind, const WeightLayout& layout, int64_t K, int64_t b0, int64_t b1, c10::BFloat16* out, int64_t ld) {
  const int64_t num_slabs = (K + SLAB_K - 1) / SLAB_K;
  at::parallel_for(0, num_slabs, 1, [&](int64_t first, int64_t end) {
    for (int64_t slab = first; slab < end; ++slab) {
      const int64_t k_begin = slab * SLAB_K, k_end = std::min(K, k_begin + SLAB_K);
      for (int64_t b = b0; b < b1; ++b) decode_block_bf16(kind, layout.at(b), k_begin, k_end, out + (b - b0) * COLS, ld);
    }
  });
}

void gemm_bf16_tiles(Codes kind, const at::Tensor& x, const WeightLayout& layout, int64_t num_blocks, int64_t out_features,
                     const float* bias, at::Tensor& out) {
  const int64_t K = x.size(1);
  const int64_t chunk_blocks = std::clamp<int64_t>(CHUNK_BYTES / (K * COLS * 2), 1, num_blocks);
  at::Tensor scratch = at::empty({K, chunk_blocks * COLS}, x.options());
  for (int64_t b0 = 0; b0 < num_blocks; b0 += chunk_blocks) {
    const int64_t b1 = std::min(num_blocks, b0 + chunk_blocks);
    const int64_t num_cols = std::min(out_features, b1 * COLS) - b0 * COLS;
    decode_blocks_bf16(kind, layout, K, b0, b1, reinterpret_cast<c10::BFloat16*>(scratch.data_ptr()), chunk_blocks * COLS);
    const at::Tensor weight = scratch.narrow(1, 0, num_cols);
    if (num_cols == out_features) {
      at::mm_out(out, x, weight);
    } else {
      at::Tensor columns = out.narrow(1, b0 * COLS, num_cols);
      columns.copy_(at::mm(x, weight));
    }
  }
  if (bias != nullptr) {  // added to the bf16 product in fp32, rounded once more
    const at::Tensor bias_f32 = at::from_blob(const_cast<float*>(bias), {out_features}, x.options().dtype(at::kFloat));
    out.copy_(out.to(at::kFloat).add_(bias_f32));
  }
}

#elif ZSERVE_HAS_GEMM_WIDEN

bool bf16_tiles_granted() { return false; }

void gemm_bf16_tiles(Codes, const at::Tensor&, const WeightLayout&, int64_t, int64_t, const float*, at::Tensor&) {
  TORCH_CHECK(false, "gemm_bf16_tiles: this build has no bf16 tiles (it needs amx_int8)");
}

#endif

}  // namespace zserve_int8_dot
