// zserve::lora_rows_: every adapted token's LoRA update of one projection, in one call, on its own adapter's
// matrices only (Punica's grouped product, SGMV's segments: the step's rows arrive grouped by adapter).
//
//   zserve::lora_rows_(y, x, a, b, order, offsets, out_offsets, rank) -> ()
//       y [T, out] (the base projection's output, updated in place), x [T, in] (its input),
//       a [num_adapters, width, in_padded]: adapter i's A rows (piece p's are rows p * rank .. p * rank + rank; width a
//         multiple of 4, in_padded of 16, zeros past the pieces and past `in`),
//       b [num_adapters, tiles, rank, 64]: adapter i's B for each piece, its columns in tiles of 64 (piece p's
//         columns y[out_offsets[p] .. out_offsets[p + 1]) are its ceil(size / 64) tiles after the pieces before it;
//         tile q holds B's rows 0 .. rank for 64 columns, zeros past the piece),
//       order int32 [n]: the adapted tokens' rows, adapter 0's first; offsets int32 [num_adapters + 1]: adapter i's
//       tokens are order[offsets[i] .. offsets[i + 1]]; rows not in `order` are left as they are.
//       For each such token t of adapter i:
//           h = a[i] @ x[t]                                                     fp32, never rounded
//           y[t, piece p's columns] += h[p's rank rows] @ B_p                   (model_proc/lora/lora_rows_layer.py)
//       y's row is widened once, summed into in fp32 and rounded to its dtype once (bf16: to nearest even).
//       float32 or bfloat16, one dtype for y, x, a and b.
//
// Why a kernel: the dense form (every token against every adapter's matrices, masked; two oneDNN products per
// projection, lora_layer.py) does 4x the FLOPs the update needs in a mixed batch and, at decode's few rows, costs
// by the call (~50-100 us of cache misses each): 240 calls a step on a 30-layer model. Here a projection's update
// is one call that reads only the adapters present, and only the non-zero blocks of a fused projection's b.
//
// Tokens go in blocks of up to 4 of one adapter: a block widens its x rows into fp32 and takes their dot products
// with its adapter's A rows, 4 rows (2 with AVX2) at a time along `in` (each A vector loaded once for the 4 tokens),
// then for each piece adds h @ B to the widened y rows a tile of 64 columns at a time (each B vector loaded once for
// the 4 tokens). Both matrices stream in the order they lie in memory. Blocks are split over threads when the call
// has work enough to pay for it. AVX-512 (16 floats a vector), AVX2 + FMA (8), scalar elsewhere; bf16 values widen by
// a 16-bit shift, exactly.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int TOKENS_PER_BLOCK = 4;
constexpr int64_t TILE_COLUMNS = 64;        // b's columns per tile
constexpr int64_t ROW_MULTIPLE = 4;         // a's rows per adapter: a multiple of this (the layer pads)
constexpr int64_t IN_MULTIPLE = 16;         // a's row length: `in` padded to a multiple of this (the layer pads)
constexpr double FLOPS_PER_THREAD = 0.5e6;  // below this much work per thread the call stays on one thread

#if defined(__AVX512F__)
struct Isa {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int ROWS = 4;     // a's rows per pass: 4 tokens x 4 rows of sums + 4 + 1 = 21 of 32 registers
  static constexpr int VECTORS = 4;  // b's vectors per pass: 4 x 4 sums + 4 + 1
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const c10::BFloat16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct Isa {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int ROWS = 2;     // 4 x 2 sums + 2 + 1 = 11 of 16 registers
  static constexpr int VECTORS = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const c10::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
  }
};
#else
struct Isa {
  using V = float;
  static constexpr int W = 1;
  static constexpr int ROWS = 4;
  static constexpr int VECTORS = 4;
  static V zero() { return 0.0f; }
  static V set1(float v) { return v; }
  static V load(const float* p) { return *p; }
  static V load(const c10::BFloat16* p) { return static_cast<float>(*p); }
  static void store(float* p, V v) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float sum(V v) { return v; }
};
#endif

using V = Isa::V;
constexpr int W = Isa::W;
static_assert(IN_MULTIPLE % W == 0 && TILE_COLUMNS % (Isa::VECTORS * W) == 0 && ROW_MULTIPLE % Isa::ROWS == 0);

// h[t][j0 .. j0 + ROWS) = a's rows j0.. . xf[t] for TB tokens; xf [TB, in_padded] fp32, a [width, in_padded]
template <typename T, int TB>
void shrink_rows(const float* xf, int64_t in_padded, const T* a, int64_t j0, int64_t width, float* h) {
  constexpr int R = Isa::ROWS;
  V sums[TB][R];
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < R; ++r) sums[t][r] = Isa::zero();
  for (int64_t k = 0; k < in_padded; k += W) {
    V rows[R];
    for (int r = 0; r < R; ++r) rows[r] = Isa::load(a + (j0 + r) * in_padded + k);
    for (int t = 0; t < TB; ++t) {
      const V xv = Isa::load(xf + t * in_padded + k);
      for (int r = 0; r < R; ++r) sums[t][r] = Isa::fma(xv, rows[r], sums[t][r]);
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < R; ++r) h[t * width + j0 + r] = Isa::sum(sums[t][r]);
}

// yf[t][c0 .. c0 + NV * W) += h[t][0 .. rank) @ tile's columns c .. c + NV * W; h [TB, width] at the piece's first
// row, tile [rank, TILE_COLUMNS], yf [TB, out]
template <typename T, int TB, int NV>
void expand_columns(const float* h, int64_t width, int64_t rank, const T* tile, int64_t c, float* yf, int64_t c0,
                    int64_t out) {
  V sums[TB][NV];
  for (int t = 0; t < TB; ++t)
    for (int v = 0; v < NV; ++v) sums[t][v] = Isa::load(yf + t * out + c0 + v * W);
  for (int64_t j = 0; j < rank; ++j) {
    V cols[NV];
    for (int v = 0; v < NV; ++v) cols[v] = Isa::load(tile + j * TILE_COLUMNS + c + v * W);
    for (int t = 0; t < TB; ++t) {
      const V hv = Isa::set1(h[t * width + j]);
      for (int v = 0; v < NV; ++v) sums[t][v] = Isa::fma(hv, cols[v], sums[t][v]);
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int v = 0; v < NV; ++v) Isa::store(yf + t * out + c0 + v * W, sums[t][v]);
}

// one tile: its `valid` first columns added into yf's columns c0 ..
template <typename T, int TB>
void expand_tile(const float* h, int64_t width, int64_t rank, const T* tile, int64_t valid, float* yf, int64_t c0,
                 int64_t out) {
  int64_t c = 0;
  for (; c + Isa::VECTORS * W <= valid; c += Isa::VECTORS * W)
    expand_columns<T, TB, Isa::VECTORS>(h, width, rank, tile, c, yf, c0 + c, out);
  for (; c + W <= valid; c += W) expand_columns<T, TB, 1>(h, width, rank, tile, c, yf, c0 + c, out);
  for (; c < valid; ++c) {  // a piece's last columns, fewer than a vector
    for (int t = 0; t < TB; ++t) {
      float sum = yf[t * out + c0 + c];
      for (int64_t j = 0; j < rank; ++j) sum += h[t * width + j] * static_cast<float>(tile[j * TILE_COLUMNS + c]);
      yf[t * out + c0 + c] = sum;
    }
  }
}

template <typename T>
void store_row(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    zserve_cpu::narrow_row(src, dst, n);
  }
}

struct Block {
  int64_t adapter, first, count;  // order[first .. first + count): count <= TOKENS_PER_BLOCK tokens of `adapter`
};

struct Shape {
  int64_t in, in_padded, width, out, rank, tiles;
  std::vector<int64_t> piece_columns;  // out_offsets
  std::vector<int64_t> piece_tiles;    // piece p's first tile; one more entry: `tiles`
};

template <typename T, int TB>
void run_block(const Block& block, const Shape& s, T* y, const T* x, const T* a, const T* b, const int32_t* order,
               float* xf, float* h, float* yf) {
  const T* a_i = a + block.adapter * s.width * s.in_padded;
  const T* b_i = b + block.adapter * s.tiles * s.rank * TILE_COLUMNS;
  for (int t = 0; t < TB; ++t) {
    const int64_t row = order[block.first + t];
    zserve_cpu::widen_row(x + row * s.in, xf + t * s.in_padded, s.in);  // the padding stays zero
    zserve_cpu::widen_row(y + row * s.out, yf + t * s.out, s.out);
  }
  for (int64_t j = 0; j < s.width; j += Isa::ROWS) shrink_rows<T, TB>(xf, s.in_padded, a_i, j, s.width, h);
  for (size_t p = 0; p + 1 < s.piece_columns.size(); ++p) {
    const int64_t first = s.piece_columns[p], end = s.piece_columns[p + 1];
    for (int64_t q = s.piece_tiles[p]; q < s.piece_tiles[p + 1]; ++q) {
      const int64_t c0 = first + (q - s.piece_tiles[p]) * TILE_COLUMNS;
      expand_tile<T, TB>(h + p * s.rank, s.width, s.rank, b_i + q * s.rank * TILE_COLUMNS,
                         std::min(TILE_COLUMNS, end - c0), yf, c0, s.out);
    }
  }
  for (int t = 0; t < TB; ++t) store_row(yf + t * s.out, y + order[block.first + t] * s.out, s.out);
}

template <typename T>
void lora_rows_typed(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                     const at::Tensor& order, const std::vector<Block>& blocks, const Shape& s) {
  T* y_ptr = y.data_ptr<T>();
  const T* x_ptr = x.data_ptr<T>();
  const T* a_ptr = a.data_ptr<T>();
  const T* b_ptr = b.data_ptr<T>();
  const int32_t* order_ptr = order.data_ptr<int32_t>();
  const double flops = 2.0 * static_cast<double>(order.numel()) * (s.in * s.width + s.rank * s.out);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), flops / FLOPS_PER_THREAD));
  const int64_t num_blocks = static_cast<int64_t>(blocks.size());
  const int64_t grain = std::max<int64_t>(1, (num_blocks + threads - 1) / threads);
  at::parallel_for(0, num_blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(TOKENS_PER_BLOCK * s.in_padded, 0.0f), h(TOKENS_PER_BLOCK * s.width);
    std::vector<float> yf(TOKENS_PER_BLOCK * s.out);
    for (int64_t i = begin; i < end; ++i) {
      const Block& block = blocks[i];
      switch (block.count) {
        case 1: run_block<T, 1>(block, s, y_ptr, x_ptr, a_ptr, b_ptr, order_ptr, xf.data(), h.data(), yf.data()); break;
        case 2: run_block<T, 2>(block, s, y_ptr, x_ptr, a_ptr, b_ptr, order_ptr, xf.data(), h.data(), yf.data()); break;
        case 3: run_block<T, 3>(block, s, y_ptr, x_ptr, a_ptr, b_ptr, order_ptr, xf.data(), h.data(), yf.data()); break;
        default: run_block<T, 4>(block, s, y_ptr, x_ptr, a_ptr, b_ptr, order_ptr, xf.data(), h.data(), yf.data());
      }
    }
  });
}

void lora_rows_(at::Tensor y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& order,
                const at::Tensor& offsets, const at::Tensor& out_offsets, int64_t rank) {
  const auto dtype = y.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "lora_rows_: float32 or bfloat16");
  for (const at::Tensor* t : {static_cast<const at::Tensor*>(&y), &x, &a, &b}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == dtype && t->is_contiguous(),
                "lora_rows_: y, x, a and b are contiguous CPU tensors of one dtype");
  }
  TORCH_CHECK(y.dim() == 2 && x.dim() == 2 && x.size(0) == y.size(0), "lora_rows_: y [T, out] and x [T, in]");
  Shape s;
  s.in = x.size(1);
  s.in_padded = (s.in + IN_MULTIPLE - 1) / IN_MULTIPLE * IN_MULTIPLE;
  s.out = y.size(1);
  s.rank = rank;
  TORCH_CHECK(a.dim() == 3 && a.size(2) == s.in_padded && a.size(1) % ROW_MULTIPLE == 0,
              "lora_rows_: a [num_adapters, width, in padded to 16], width a multiple of 4");
  s.width = a.size(1);
  TORCH_CHECK(out_offsets.scalar_type() == at::kLong && out_offsets.is_contiguous() && out_offsets.numel() >= 2,
              "lora_rows_: out_offsets int64 [pieces + 1]");
  const int64_t num_pieces = out_offsets.numel() - 1;
  TORCH_CHECK(rank > 0 && num_pieces * rank <= s.width, "lora_rows_: pieces * rank <= width");
  const int64_t* piece = out_offsets.data_ptr<int64_t>();
  TORCH_CHECK(piece[0] == 0 && piece[num_pieces] == s.out, "lora_rows_: out_offsets from 0 to y's columns");
  s.piece_tiles.push_back(0);
  for (int64_t p = 0; p < num_pieces; ++p) {
    TORCH_CHECK(piece[p] <= piece[p + 1], "lora_rows_: out_offsets sorted");
    s.piece_columns.push_back(piece[p]);
    s.piece_tiles.push_back(s.piece_tiles.back() + (piece[p + 1] - piece[p] + TILE_COLUMNS - 1) / TILE_COLUMNS);
  }
  s.piece_columns.push_back(piece[num_pieces]);
  s.tiles = s.piece_tiles.back();
  TORCH_CHECK(b.dim() == 4 && b.size(0) == a.size(0) && b.size(1) == s.tiles && b.size(2) == rank &&
                  b.size(3) == TILE_COLUMNS,
              "lora_rows_: b [num_adapters, tiles, rank, 64]");
  TORCH_CHECK(order.scalar_type() == at::kInt && offsets.scalar_type() == at::kInt && order.is_contiguous() &&
                  offsets.is_contiguous() && offsets.numel() == a.size(0) + 1,
              "lora_rows_: order int32 [n], offsets int32 [num_adapters + 1]");
  const int32_t* order_ptr = order.data_ptr<int32_t>();
  for (int64_t i = 0; i < order.numel(); ++i) {
    TORCH_CHECK(order_ptr[i] >= 0 && order_ptr[i] < y.size(0), "lora_rows_: order names a row outside y");
  }
  const int32_t* first = offsets.data_ptr<int32_t>();
  std::vector<Block> blocks;
  for (int64_t i = 0; i < a.size(0); ++i) {
    TORCH_CHECK(first[i] <= first[i + 1] && first[i] >= 0 && first[i + 1] <= order.numel(),
                "lora_rows_: offsets sorted, within order");
    for (int64_t t = first[i]; t < first[i + 1]; t += TOKENS_PER_BLOCK) {
      blocks.push_back({i, t, std::min<int64_t>(TOKENS_PER_BLOCK, first[i + 1] - t)});
    }
  }
  if (blocks.empty()) return;
  if (dtype == at::kFloat) {
    lora_rows_typed<float>(y, x, a, b, order, blocks, s);
  } else {
    lora_rows_typed<c10::BFloat16>(y, x, a, b, order, blocks, s);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("lora_rows_(Tensor(a!) y, Tensor x, Tensor a, Tensor b, Tensor order, Tensor offsets, Tensor out_offsets, "
        "int rank) -> ()",
        &lora_rows_);
}
