// The int8 x int8 GEMM's many rows in AMX tiles (Sapphire Rapids and later, feature amx_int8):
// gemm_int8_dot.cpp hands whole tiles of 16 rows here from AMX_MIN_ROWS rows (int8_dot.h) when
// amx_granted(), the rest of the rows to its vector path.
//
// The packed weights are already the B-tile layout of TDPBSUD: the quad layout's row p of a block
// is k = 4p..4p+3 of its 16 columns, 64 bytes (C + 128 for int8 codes: unsigned, as TDPBSUD's B
// wants them; nibble pairs are expanded into bytes once per block into `scratch`, low nibbles to
// row 2p, high ones to 2p + 1). A is 16 rows of the signed activation codes xq, read in place
// (stride K). One TDPBSUD per sub-block of SB = min(G, 32) k (A 16 x SB bytes, B SB / 4 rows,
// C 16 x 16 int32) gives the exact int32 sums the vector path's VPDPBUSD gives; they are stored
// and rescaled in zmm registers exactly as gemm_int8_dot.cpp's dot_block_rows does (same fp32
// operations in the same order), so the outputs are bit-identical to the vector path's.
// Two sub-blocks are in flight at a time (tiles 0-2 and 3-5).
//
// The tile configuration is loaded by our own LDTILECFG (load_tile_config: GCC 12's intrinsic lets the
// compiler drop the configuration's stores), on every call, and released after a thread's last call.
//
// The tiles need the OS's permission (Linux: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, once
// per process, for all its threads). Without it the first tile instruction faults (SIGILL), so
// amx_granted() asks once and the kernels never touch a tile when it was refused. The kernel
// refuses when a thread of the process has a signal stack (sigaltstack) too small for the
// enlarged signal frame (ENOSPC); the refusal is then final for this process and logged once by
// the Python side (kernels/cpu_kernels.py).

#include <cstring>

#include "int8_dot.h"
#include "six_bit_codes.h"

#if ZSERVE_HAS_GEMM_WIDEN && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define ZSERVE_HAS_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define ZSERVE_HAS_AMX 0
#endif

namespace zserve_int8_dot {

#if ZSERVE_HAS_AMX

namespace {

constexpr long ARCH_GET_XCOMP_PERM = 0x1022;
constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;
constexpr int TILE_ROWS_AMX = 16;  // rows of x per A tile (and of C)
constexpr int64_t TILE_ROW_BYTES = 64;

bool request_tiles() {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
  uint64_t permitted = 0;
  return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &permitted) == 0 && ((permitted >> XFEATURE_XTILEDATA) & 1) != 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0, 3: A (16 rows x SB bytes); 1, 4: B (SB / 4 rows x 64 bytes); 2, 5: C (16 x 16 int32)
TileConfig tile_config(int64_t sub_block) {
  TileConfig config;
  for (int t : {0, 3}) {
    config.rows[t] = TILE_ROWS_AMX;
    config.colsb[t] = static_cast<uint16_t>(sub_block);
  }
  for (int t : {1, 4}) {
    config.rows[t] = static_cast<uint8_t>(sub_block / QUAD);
    config.colsb[t] = TILE_ROW_BYTES;
  }
  for (int t : {2, 5}) {
    config.rows[t] = TILE_ROWS_AMX;
    config.colsb[t] = TILE_ROW_BYTES;
  }
  return config;
}

// LDTILECFG, reading all 64 bytes. Not GCC 12's _tile_loadconfig: its asm names only the first 8 bytes
// as an input ("m" (*(const void **) config)), so the compiler may drop or sink the stores of the
// rest of the configuration as dead; llama.cpp's AMX kernels (mmq.cpp, built by GCC 12) load a
// stack configuration whose rows and colsb were never written and die on this machine: LDTILECFG
// raises #GP (SIGSEGV) on the invalid configuration, or a later tile instruction #UD (SIGILL).
inline void load_tile_config(const TileConfig& config) { asm volatile("ldtilecfg %0" ::"m"(config)); }

// nibble pairs [K / 8, 16, 4] -> bytes [K / 4, 16, 4]: row p's low nibbles to row 2p, high ones to 2p + 1
void expand_nibbles(const uint8_t* nibbles, int64_t K, uint8_t* bytes) {
  const __m512i low_mask = _mm512_set1_epi8(0x0f);
  for (int64_t p = 0; p < K / (2 * QUAD); ++p) {
    const __m512i v = _mm512_loadu_si512(nibbles + p * TILE_ROW_BYTES);
    _mm512_storeu_si512(bytes + 2 * p * TILE_ROW_BYTES, _mm512_and_si512(v, low_mask));
    _mm512_storeu_si512(bytes + (2 * p + 1) * TILE_ROW_BYTES, _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask));
  }
  asm volatile("" ::: "memory");  // the tile loads (asm without a memory operand) come after these stores
}

// dot_block_rows's rescale of sub-block `s` (k0 = s * SB), for 16 rows: dots [16, 16] int32. The rows'
// terms (128 * sum(xq), s * sum(xq)) come precomputed (amx_row_terms: the same int32 and fp32 values).
template <Codes KIND>
inline void rescale(const int32_t* dots, int64_t s, int64_t sub_block, const float* xs, int64_t num_act, const AmxRowTerms& terms,
                    int64_t m, const Weights& w, vec* total) {
  const int64_t k0 = s * sub_block, g = k0 / w.G, a = k0 / ACT_BLOCK;
  vec weight_scale[NV], weight_offset[NV];
  w.group(g, weight_scale, weight_offset);
  const int32_t* corrections = terms.corrections.data() + m * terms.num_subs + s;
  const float* scaled_sums = terms.scaled_sums.data() + m * terms.num_subs + s;
  for (int r = 0; r < TILE_ROWS_AMX; ++r) {
    __m512i dot = _mm512_load_si512(dots + r * COLS);
    if constexpr (KIND != Codes::NIBBLES) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(corrections[r * terms.num_subs]));  // TDPBSUD took C + 128
    const vec scale = vset1(xs[r * num_act + a]);
    total[r] = vfma(_mm512_cvtepi32_ps(dot), vmul(weight_scale[0], scale), total[r]);
    if (w.has_offsets()) total[r] = vfma(weight_offset[0], vset1(scaled_sums[r * terms.num_subs]), total[r]);
  }
}

// sub-blocks s and s + 1 (when there) of one row tile: TDPBSUD into tiles 2 and 5, stored to dots[0], dots[1]
inline void tile_dots(const int8_t* a_rows, const uint8_t* b_rows, int64_t K, int64_t s, int64_t sub_block, int64_t num_subs,
                      int32_t (*dots)[TILE_ROWS_AMX * COLS]) {
  const int64_t k0 = s * sub_block, k1 = k0 + sub_block;
  _tile_loadd(0, a_rows + k0, K);
  _tile_loadd(1, b_rows + (k0 / QUAD) * TILE_ROW_BYTES, TILE_ROW_BYTES);
  _tile_zero(2);
  _tile_dpbsud(2, 0, 1);
  if (s + 1 < num_subs) {
    _tile_loadd(3, a_rows + k1, K);
    _tile_loadd(4, b_rows + (k1 / QUAD) * TILE_ROW_BYTES, TILE_ROW_BYTES);
    _tile_zero(5);
    _tile_dpbsud(5, 3, 4);
  }
  _tile_stored(2, dots[0], COLS * sizeof(int32_t));
  if (s + 1 < num_subs) _tile_stored(5, dots[1], COLS * sizeof(int32_t));
}

template <Codes KIND>
void dot_rows(const int8_t* xq, const float* xs, const AmxRowTerms& terms, int64_t rows, int64_t K, const Weights& w,
              uint8_t* scratch, float* sums) {
  static_assert(NV == 1, "an AMX build is a 512-bit build: one zmm per row of a block");
  const int64_t sub_block = std::min<int64_t>(w.G, ACT_BLOCK);
  const int64_t num_act = K / ACT_BLOCK, num_subs = K / sub_block;
  TORCH_CHECK(terms.num_subs == num_subs, "amx_dot_rows: row terms for another group size");
  const TileConfig config = tile_config(sub_block);
  load_tile_config(config);
  const uint8_t* b_rows = w.codes;  // [K / 4, 64]
  if constexpr (KIND == Codes::NIBBLES) {
    expand_nibbles(w.codes, K, scratch);
    b_rows = scratch;
  } else if constexpr (KIND == Codes::SIX) {  // C + 32 as int8 quads C' + 128: then the int8 path's sums
    zserve_six_bit::expand_to_quads(w.codes, 0, K, scratch);
    b_rows = scratch;
  }
  // software-pipelined: the tiles of the next pair of sub-blocks run while this pair is rescaled
  alignas(64) int32_t dots[2][2][TILE_ROWS_AMX * COLS];
  for (int64_t m = 0; m < rows; m += TILE_ROWS_AMX) {
    const int8_t* a_rows = xq + m * K;
    const float* row_xs = xs + m * num_act;
    vec total[TILE_ROWS_AMX];
    for (vec& t : total) t = vzero();
    tile_dots(a_rows, b_rows, K, 0, sub_block, num_subs, dots[0]);
    for (int64_t s = 0, turn = 0; s < num_subs; s += 2, turn ^= 1) {
      if (s + 2 < num_subs) tile_dots(a_rows, b_rows, K, s + 2, sub_block, num_subs, dots[turn ^ 1]);
      rescale<KIND>(dots[turn][0], s, sub_block, row_xs, num_act, terms, m, w, total);
      if (s + 1 < num_subs) rescale<KIND>(dots[turn][1], s + 1, sub_block, row_xs, num_act, terms, m, w, total);
    }
    for (int r = 0; r < TILE_ROWS_AMX; ++r) vstore(sums + (m + r) * COLS, total[r]);
  }
}

}  // namespace

bool amx_granted() {
  static const bool granted = request_tiles();  // once per process: the permission is the process's
  return granted;
}

void amx_end() { _tile_release(); }

AmxRowTerms amx_row_terms(const float* xs, const int32_t* x_sums16, int64_t rows, int64_t K, int64_t group_size) {
  const int64_t sub_block = std::min<int64_t>(group_size, ACT_BLOCK);
  const int64_t num_act = K / ACT_BLOCK, num_sums = K / SUM_BLOCK, num_subs = K / sub_block;
  AmxRowTerms terms{std::vector<int32_t>(rows * num_subs), std::vector<float>(rows * num_subs), num_subs};
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t s = 0; s < num_subs; ++s) {  // dot_block_rows's x_sum, 128 * x_sum and row_scale * float(x_sum)
      const int64_t k0 = s * sub_block;
      const int32_t* row_sums = x_sums16 + m * num_sums + k0 / SUM_BLOCK;
      const int32_t x_sum = sub_block == SUM_BLOCK ? row_sums[0] : row_sums[0] + row_sums[1];
      terms.corrections[m * num_subs + s] = 128 * x_sum;
      terms.scaled_sums[m * num_subs + s] = xs[m * num_act + k0 / ACT_BLOCK] * static_cast<float>(x_sum);
    }
  return terms;
}

void amx_dot_rows(Codes kind, const int8_t* xq, const float* xs, const AmxRowTerms& terms, int64_t rows, int64_t K,
                  const Weights& w, uint8_t* scratch, float* sums) {
  TORCH_CHECK(amx_granted() && rows % TILE_ROWS_AMX == 0, "amx_dot_rows: no tiles granted, or rows not a multiple of 16");
  if (kind == Codes::NIBBLES) {
    dot_rows<Codes::NIBBLES>(xq, xs, terms, rows, K, w, scratch, sums);
  } else if (kind == Codes::SIX) {
    dot_rows<Codes::SIX>(xq, xs, terms, rows, K, w, scratch, sums);
  } else {
    dot_rows<Codes::INT8>(xq, xs, terms, rows, K, w, scratch, sums);
  }
}

#elif ZSERVE_HAS_GEMM_WIDEN

bool amx_granted() { return false; }
void amx_end() {}
AmxRowTerms amx_row_terms(const float*, const int32_t*, int64_t, int64_t, int64_t) { return {}; }
void amx_dot_rows(Codes, const int8_t*, const float*, const AmxRowTerms&, int64_t, int64_t, const Weights&, uint8_t*, float*) {
  TORCH_CHECK(false, "amx_dot_rows: this build has no AMX-INT8");
}

#endif

}  // namespace zserve_int8_dot
