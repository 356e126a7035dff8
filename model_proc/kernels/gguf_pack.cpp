// A GGUF matrix's quantized rows straight into the int8 x int8 GEMM's layout (gemm_int8_dot.cpp),
// in one pass, without decoding to a [rows, cols] array first (model_proc/gguf_blocks.py is the
// same decoding in numpy, and the reference the tests hold this to):
//
//   zserve::gguf_pack(raw, type_name, row_ids, in_features)
//       -> (values, scale_supers, scale_subs, offset_supers, offset_subs, bits, group_size, implied_offset)
//
//   raw          uint8 [R, row_bytes]   the file's rows (one row: in_features values, an output channel)
//   type_name    Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL or IQ4_XS
//   row_ids      int64 [N]              the raw rows that become output columns 0..N-1, in order
//                                       (a tensor-parallel shard, llama's q/k rows un-permuted)
//   values       4-bit types (Q4_0, Q4_1, Q4_K): uint8 [NB, K / 8, 16, 4] nibbles
//                (element (b, p, j, i): C[8p + i, 16b + j] | C[8p + 4 + i, 16b + j] << 4);
//                Q6_K: uint8 [NB, 3K / 16, 16, 4] 6-bit codes q + 32 (six_bit_codes.h's units);
//                the others: uint8 [NB, K / 4, 16, 4] quads (C[4p + i, 16b + j] + 128)
//   scale_supers fp16 [NB, K / B, 16]   the file's own fp16 scale of each block of B values (d)
//   scale_subs   int8 [NB, K / G, 16]   its factor for each group of G values (Q4_K: the 6-bit sc): S =
//                                       float(super) * float(sub); empty where the block is one group (the
//                                       factor 1, kept by no byte: S = float(super))
//   offset_supers, offset_subs          likewise for the offsets O (Q4_K, Q2_K: dmin and -m; Q4_1, Q5_1: m and no
//                                       subs); offset_supers empty where the offsets share the scale supers
//                                       (Q4_0: d), both empty where there are none (Q8_0, Q5_0, Q6_K)
//   implied_offset                      the one offset factor of a one-group block, kept by no byte: O =
//                                       float(offset super) * implied_offset (Q4_0: -8, Q4_1 and Q5_1: 1; else 0)
//   bits, group_size   4, 6 (Q6_K) or 8; 32 (16 for Q6_K)
//
// NB = ceil(N / 16); columns past N hold code 0 (quads: 128, 6-bit: 32) with supers and subs 0. Each S and O
// is one fp32 product of the file's values, as gguf's dequantization computes it (d * sc,
// -(dmin * m) = dmin * -m, -8 d = d * -8, d * 1), so codes * S + O equals gguf.quants.dequantize
// bit for bit; kept this way a Q4_K weight takes 0.58 bytes (the file: 0.5625), not 0.75 with fp32 S, O,
// and a Q6_K weight 0.82 (as the file), not 1.07 as int8 codes. Q2_K, Q3_K, IQ4_NL and IQ4_XS become int8
// codes (their scales compact too: 1.07 to 1.14 bytes a weight, where fp32 ones took 1.125 to 1.5).

#include <torch/library.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>

#include "six_bit_codes.h"

namespace {

constexpr int64_t COLS = 16;   // output columns per block of the GEMM's layout
constexpr int64_t QK_K = 256;  // values per K-quant super-block

enum class Offsets { NONE, SHARED_SUPER, OWN_SUPER };  // none; scale's super times a sub; a super of their own
enum class Type { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS };

struct TypeInfo {
  Type type;
  int64_t block_values, block_bytes, group, bits;
  Offsets offsets;
  int64_t implied_offset = 0;  // one-group blocks with offsets: their offset factor (not stored)
};

bool type_info(const std::string& name, TypeInfo& info) {
  if (name == "Q8_0") info = {Type::Q8_0, 32, 34, 32, 8, Offsets::NONE};
  else if (name == "Q4_0") info = {Type::Q4_0, 32, 18, 32, 4, Offsets::SHARED_SUPER, -8};
  else if (name == "Q4_1") info = {Type::Q4_1, 32, 20, 32, 4, Offsets::OWN_SUPER, 1};
  else if (name == "Q5_0") info = {Type::Q5_0, 32, 22, 32, 8, Offsets::NONE};
  else if (name == "Q5_1") info = {Type::Q5_1, 32, 24, 32, 8, Offsets::OWN_SUPER, 1};
  else if (name == "Q4_K") info = {Type::Q4_K, QK_K, 144, 32, 4, Offsets::OWN_SUPER};
  else if (name == "Q5_K") info = {Type::Q5_K, QK_K, 176, 32, 8, Offsets::OWN_SUPER};
  else if (name == "Q6_K") info = {Type::Q6_K, QK_K, 210, 16, 6, Offsets::NONE};
  else if (name == "Q2_K") info = {Type::Q2_K, QK_K, 84, 16, 8, Offsets::OWN_SUPER};
  else if (name == "Q3_K") info = {Type::Q3_K, QK_K, 110, 16, 8, Offsets::NONE};
  else if (name == "IQ4_NL") info = {Type::IQ4_NL, 32, 18, 32, 8, Offsets::NONE};
  else if (name == "IQ4_XS") info = {Type::IQ4_XS, QK_K, 136, 32, 8, Offsets::NONE};
  else return false;
  return true;
}

inline uint16_t f16_bits(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bits;
}

// One block's scales and offsets as the file holds them: fp16 supers, int8 factors per group.
struct BlockScales {
  uint16_t scale_super = 0, offset_super = 0;
  int8_t scale_subs[16] = {}, offset_subs[16] = {};
};

// ggml's packing of `bits`-bit fields (gguf_decoded_blocks.bit_planes): each chunk of `run` bytes gives
// its lowest fields, then the next ones up; `num_bytes` bytes -> num_bytes * 8 / bits fields.
inline void bit_planes(const uint8_t* packed, int num_bytes, int run, int bits, uint8_t* out) {
  const int per_byte = 8 / bits, mask = (1 << bits) - 1;
  for (int chunk = 0; chunk < num_bytes / run; ++chunk)
    for (int f = 0; f < per_byte; ++f)
      for (int r = 0; r < run; ++r) *out++ = (packed[chunk * run + r] >> (f * bits)) & mask;
}

constexpr int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Q2_K, Q3_K, IQ4_NL, IQ4_XS (gguf_super_blocks.py, gguf_small_blocks.py): int8 codes + 128, d (and dmin)
// as fp16 supers, their 4-bit, 6-bit (and m) factors as int8 subs.
void decode_low_bit_block(Type type, const uint8_t* b, uint8_t* codes, BlockScales& s);

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes.
inline void k_scale_min(const uint8_t* q, int j, uint8_t& sc, uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 2) & 0x30);
    mn = (q[j + 4] >> 4) | ((q[j] >> 2) & 0x30);
  }
}

// One block of one row: its codes as the packed layout stores them (4-bit types: the code 0..15;
// Q6_K: q + 32, 0..63; the others: code + 128), and its scales and offsets as the file keeps them.
void decode_block(Type type, const uint8_t* b, uint8_t* codes, BlockScales& s) {
  if (type == Type::Q8_0) {
    s.scale_super = f16_bits(b), s.scale_subs[0] = 1;
    for (int l = 0; l < 32; ++l) codes[l] = static_cast<uint8_t>(b[2 + l] ^ 0x80);  // int8 q + 128
  } else if (type == Type::Q4_0 || type == Type::Q4_1) {
    const uint8_t* qs = b + (type == Type::Q4_0 ? 2 : 4);
    s.scale_super = f16_bits(b), s.scale_subs[0] = 1;
    if (type == Type::Q4_0) {
      s.offset_subs[0] = -8;  // times the scale's super: -8 d
    } else {
      s.offset_super = f16_bits(b + 2), s.offset_subs[0] = 1;  // m
    }
    for (int l = 0; l < 16; ++l) {
      codes[l] = qs[l] & 0x0F;
      codes[l + 16] = qs[l] >> 4;
    }
  } else if (type == Type::Q5_0 || type == Type::Q5_1) {
    const bool q5_0 = type == Type::Q5_0;
    const uint8_t* qh_bytes = b + (q5_0 ? 2 : 4);
    const uint8_t* qs = qh_bytes + 4;
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    s.scale_super = f16_bits(b), s.scale_subs[0] = 1;
    if (!q5_0) s.offset_super = f16_bits(b + 2), s.offset_subs[0] = 1;
    const int bias = q5_0 ? 128 - 16 : 128;  // Q5_0's code is q - 16
    for (int l = 0; l < 16; ++l) {
      codes[l] = static_cast<uint8_t>(((qs[l] & 0x0F) | (((qh >> l) & 1) << 4)) + bias);
      codes[l + 16] = static_cast<uint8_t>(((qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) + bias);
    }
  } else if (type == Type::Q4_K || type == Type::Q5_K) {
    const bool q5 = type == Type::Q5_K;
    const uint8_t* packed_scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (q5 ? 48 : 16);
    s.scale_super = f16_bits(b), s.offset_super = f16_bits(b + 2);  // d, dmin
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      k_scale_min(packed_scales, j, sc, mn);
      s.scale_subs[j] = static_cast<int8_t>(sc);
      s.offset_subs[j] = static_cast<int8_t>(-static_cast<int>(mn));  // dmin * -m = -(dmin * m), exactly
    }
    for (int chunk = 0; chunk < 4; ++chunk) {  // 64 values: the low nibbles of 32 bytes, then their high ones
      for (int l = 0; l < 32; ++l) {
        codes[64 * chunk + l] = qs[32 * chunk + l] & 0x0F;
        codes[64 * chunk + 32 + l] = qs[32 * chunk + l] >> 4;
      }
    }
    if (q5) {  // the fifth bit of value v is bit v / 32 of qh[v % 32]; the codes become int8 codes + 128
      for (int v = 0; v < QK_K; ++v) codes[v] = static_cast<uint8_t>((codes[v] | (((qh[v % 32] >> (v / 32)) & 1) << 4)) + 128);
    }
  } else if (type == Type::Q2_K || type == Type::Q3_K || type == Type::IQ4_NL || type == Type::IQ4_XS) {
    decode_low_bit_block(type, b, codes, s);
  } else {  // Q6_K
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    s.scale_super = f16_bits(b + 208);
    for (int g = 0; g < 16; ++g) s.scale_subs[g] = sc[g];
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < 128; ++r) {
        const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        codes[128 * h + r] = static_cast<uint8_t>(low | (high << 4));  // q + 32
      }
  }
}

void decode_low_bit_block(Type type, const uint8_t* b, uint8_t* codes, BlockScales& s) {
  uint8_t fields[QK_K];
  if (type == Type::Q2_K) {  // scales[16], qs[64], d, dmin: w = d (sc & 15) q - dmin (sc >> 4)
    bit_planes(b + 16, 64, 32, 2, fields);
    for (int v = 0; v < QK_K; ++v) codes[v] = static_cast<uint8_t>(fields[v] + 128);
    s.scale_super = f16_bits(b + 80), s.offset_super = f16_bits(b + 82);
    for (int g = 0; g < 16; ++g) {
      s.scale_subs[g] = static_cast<int8_t>(b[g] & 0x0F);
      s.offset_subs[g] = static_cast<int8_t>(-(b[g] >> 4));  // dmin * -m = -(dmin * m), exactly
    }
  } else if (type == Type::Q3_K) {  // hmask[32], qs[64], scales[12], d: w = d (sc - 32) (q - 4 where the hmask bit is 0)
    uint8_t high[QK_K], low_sc[16], high_sc[16];
    bit_planes(b + 32, 64, 32, 2, fields);
    bit_planes(b, 32, 32, 1, high);
    for (int v = 0; v < QK_K; ++v) codes[v] = static_cast<uint8_t>(fields[v] - (high[v] ? 0 : 4) + 128);
    bit_planes(b + 96, 8, 8, 4, low_sc);
    bit_planes(b + 104, 4, 4, 2, high_sc);
    s.scale_super = f16_bits(b + 108);
    for (int g = 0; g < 16; ++g) s.scale_subs[g] = static_cast<int8_t>((low_sc[g] | (high_sc[g] << 4)) - 32);
  } else if (type == Type::IQ4_NL) {  // d, qs[16]: w = d t[q]
    bit_planes(b + 2, 16, 16, 4, fields);
    for (int v = 0; v < 32; ++v) codes[v] = static_cast<uint8_t>(IQ4_VALUES[fields[v]] + 128);
    s.scale_super = f16_bits(b), s.scale_subs[0] = 1;
  } else {  // IQ4_XS: d, scales_h (uint16), scales_l[4], qs[128]: w = d (ls - 32) t[q]
    bit_planes(b + 8, 128, 16, 4, fields);
    for (int v = 0; v < QK_K; ++v) codes[v] = static_cast<uint8_t>(IQ4_VALUES[fields[v]] + 128);
    uint8_t low_ls[8];
    bit_planes(b + 4, 4, 1, 4, low_ls);
    const uint16_t high_ls = f16_bits(b + 2);
    s.scale_super = f16_bits(b);
    for (int g = 0; g < 8; ++g) s.scale_subs[g] = static_cast<int8_t>((low_ls[g] | (((high_ls >> (2 * g)) & 3) << 4)) - 32);
  }
}

using PackResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t>;

PackResult gguf_pack(const at::Tensor& raw, const std::string& type_name, const at::Tensor& row_ids, int64_t in_features) {
  TypeInfo info;
  TORCH_CHECK(type_info(type_name, info), "gguf_pack: GGUF type ", type_name, " is not packed here");
  const int64_t K = in_features;
  TORCH_CHECK(K > 0 && K % info.block_values == 0, "gguf_pack: ", type_name, " rows are whole blocks of ", info.block_values,
              " values; in_features is ", K);
  const int64_t blocks_per_row = K / info.block_values, row_bytes = blocks_per_row * info.block_bytes;
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.size(1) == row_bytes,
              "gguf_pack: raw must be contiguous uint8 [rows, ", row_bytes, "] for ", K, " ", type_name, " values a row");
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.scalar_type() == at::kLong && row_ids.is_contiguous(), "gguf_pack: row_ids must be int64 [N]");
  const int64_t num_rows = raw.size(0), N = row_ids.size(0);
  const int64_t* ids = row_ids.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(ids[n] >= 0 && ids[n] < num_rows, "gguf_pack: row id ", ids[n], " outside ", num_rows, " rows");
  const int64_t NB = (N + COLS - 1) / COLS, NG = K / info.group, groups_per_block = info.block_values / info.group;
  const int64_t k_per_load = info.bits == 4 ? 8 : 4;  // k in one 4-byte lane of a column (6 bits: 3 lanes per 16 k)
  const int64_t lane_rows = info.bits == 6 ? 3 * K / zserve_six_bit::K_PER_UNIT : K / k_per_load;
  const auto u8 = raw.options();
  const bool offsets = info.offsets != Offsets::NONE, own_super = info.offsets == Offsets::OWN_SUPER;
  const bool subs = groups_per_block > 1;  // one-group blocks: the factors are 1 (scales) and implied_offset
  at::Tensor values = at::empty({NB, lane_rows, COLS, 4}, u8);
  at::Tensor scale_supers = at::zeros({NB, blocks_per_row, COLS}, u8.dtype(at::kHalf));
  at::Tensor scale_subs = subs ? at::zeros({NB, NG, COLS}, u8.dtype(at::kChar)) : at::empty({0}, u8.dtype(at::kChar));
  at::Tensor offset_supers = own_super ? at::zeros({NB, blocks_per_row, COLS}, u8.dtype(at::kHalf)) : at::empty({0}, u8.dtype(at::kHalf));
  at::Tensor offset_subs = offsets && subs ? at::zeros({NB, NG, COLS}, u8.dtype(at::kChar)) : at::empty({0}, u8.dtype(at::kChar));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* vp = values.data_ptr<uint8_t>();
  auto* ssup = reinterpret_cast<uint16_t*>(scale_supers.data_ptr());
  int8_t* ssub = subs ? scale_subs.data_ptr<int8_t>() : nullptr;
  auto* osup = own_super ? reinterpret_cast<uint16_t*>(offset_supers.data_ptr()) : nullptr;
  int8_t* osub = offsets && subs ? offset_subs.data_ptr<int8_t>() : nullptr;
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    // this column block's 16 rows of codes, each as the layout stores a code (a byte); columns past N stay zero codes
    std::vector<uint8_t> rows(static_cast<size_t>(COLS) * K);
    const uint8_t zero_code = info.bits == 4 ? 0 : info.bits == 6 ? zserve_six_bit::ZERO_CODE : 128;
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t j = 0; j < COLS; ++j) {
        const int64_t n = b * COLS + j;
        uint8_t* row_codes = rows.data() + j * K;
        if (n >= N) {
          std::fill(row_codes, row_codes + K, zero_code);
          continue;
        }
        const uint8_t* row = src + ids[n] * row_bytes;
        for (int64_t blk = 0; blk < blocks_per_row; ++blk) {
          BlockScales s;
          decode_block(info.type, row + blk * info.block_bytes, row_codes + blk * info.block_values, s);
          ssup[(b * blocks_per_row + blk) * COLS + j] = s.scale_super;
          if (osup != nullptr) osup[(b * blocks_per_row + blk) * COLS + j] = s.offset_super;
          if (ssub == nullptr) {
            TORCH_CHECK(s.scale_subs[0] == 1 && s.offset_subs[0] == (offsets ? info.implied_offset : 0), "gguf_pack: ", type_name,
                        "'s one-group factors are not the implied ones");  // an invariant of decode_block, not the file
            continue;
          }
          for (int64_t g = 0; g < groups_per_block; ++g) {
            const int64_t group = blk * groups_per_block + g;
            ssub[(b * NG + group) * COLS + j] = s.scale_subs[g];
            if (osub != nullptr) osub[(b * NG + group) * COLS + j] = s.offset_subs[g];
          }
        }
      }
      // each 4-byte lane (p, j) of the layout: quads hold codes 4p..4p+3 of column j as they are; nibbles hold
      // codes 8p..8p+3 in the low halves and 8p+4..8p+7 in the high ones (codes < 16: a shift stays in its byte)
      uint32_t* out = reinterpret_cast<uint32_t*>(vp + b * lane_rows * COLS * 4);
      if (info.bits == 6) {  // six_bit_codes.h: per 16 k, two rows of low nibbles and one of 2-bit highs
        for (int64_t j = 0; j < COLS; ++j)
          for (int64_t u = 0; u < K / zserve_six_bit::K_PER_UNIT; ++u) {
            uint32_t* unit = out + 3 * u * COLS;
            zserve_six_bit::pack_lanes(rows.data() + j * K + 16 * u, unit[j], unit[COLS + j], unit[2 * COLS + j]);
          }
        continue;
      }
      for (int64_t j = 0; j < COLS; ++j) {
        const uint8_t* row_codes = rows.data() + j * K;
        for (int64_t p = 0; p < K / k_per_load; ++p) {
          uint32_t lane;
          if (info.bits == 4) {
            uint32_t low, high;
            std::memcpy(&low, row_codes + 8 * p, 4);
            std::memcpy(&high, row_codes + 8 * p + 4, 4);
            lane = low | (high << 4);
          } else {
            std::memcpy(&lane, row_codes + 4 * p, 4);
          }
          out[p * COLS + j] = lane;
        }
      }
    }
  });
  return {values, scale_supers, scale_subs, offset_supers, offset_subs, info.bits, info.group, info.implied_offset};
}

bool gguf_pack_supports(const std::string& type_name) {
  TypeInfo info;
  return type_info(type_name, info);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gguf_pack_supports(str type_name) -> bool", &gguf_pack_supports);
  m.def("gguf_pack(Tensor raw, str type_name, Tensor row_ids, int in_features) -> (Tensor, Tensor, Tensor, Tensor, Tensor, int, int, int)",
        &gguf_pack);
}
