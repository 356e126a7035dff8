// A GGUF matrix's quantized rows straight into the int8 x int8 GEMM's layout (gemm_int8_dot.cpp),
// in one pass, without decoding to a [rows, cols] array first (model_proc/gguf_blocks.py is the
// same decoding in numpy, and the reference the tests hold this to):
//
//   zserve::gguf_pack(raw, type_name, row_ids, in_features) -> (values, scales, offsets, bits, group_size)
//
//   raw          uint8 [R, row_bytes]   the file's rows (one row: in_features values, an output channel)
//   type_name    Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K
//   row_ids      int64 [N]              the raw rows that become output columns 0..N-1, in order
//                                       (a tensor-parallel shard, llama's q/k rows un-permuted)
//   values       4-bit types (Q4_0, Q4_1, Q4_K): uint8 [NB, K / 8, 16, 4] nibbles
//                (element (b, p, j, i): C[8p + i, 16b + j] | C[8p + 4 + i, 16b + j] << 4);
//                the others: uint8 [NB, K / 4, 16, 4] quads (C[4p + i, 16b + j] + 128)
//   scales       float32 [NB, K / G, 16]; offsets likewise, or an empty tensor (Q8_0, Q5_0, Q6_K)
//   bits, group_size   4 or 8; 32 (16 for Q6_K)
//
// NB = ceil(N / 16); columns past N hold code 0 (quads: 128) with scale and offset 0. Each
// scale and offset is the fp32 product gguf's dequantization computes (d * sc, -(dmin * m), -8 d),
// so values * scales + offsets equals gguf.quants.dequantize bit for bit.

#include <torch/library.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>

namespace {

constexpr int64_t COLS = 16;   // output columns per block of the GEMM's layout
constexpr int64_t QK_K = 256;  // values per K-quant super-block

struct TypeInfo {
  int64_t block_values, block_bytes, group, bits;
  bool offsets;
};

bool type_info(const std::string& name, TypeInfo& info) {
  if (name == "Q8_0") info = {32, 34, 32, 8, false};
  else if (name == "Q4_0") info = {32, 18, 32, 4, true};
  else if (name == "Q4_1") info = {32, 20, 32, 4, true};
  else if (name == "Q5_0") info = {32, 22, 32, 8, false};
  else if (name == "Q5_1") info = {32, 24, 32, 8, true};
  else if (name == "Q4_K") info = {QK_K, 144, 32, 4, true};
  else if (name == "Q5_K") info = {QK_K, 176, 32, 8, true};
  else if (name == "Q6_K") info = {QK_K, 210, 16, 8, false};
  else return false;
  return true;
}

inline float f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

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

// One block of one row: its codes (int, as the kernel reads them before packing), and the scale
// and offset of each group it holds.
void decode_block(const std::string& type, const uint8_t* b, int32_t* codes, float* scales, float* offsets) {
  if (type == "Q8_0") {
    scales[0] = f16(b);
    for (int l = 0; l < 32; ++l) codes[l] = static_cast<int8_t>(b[2 + l]);
  } else if (type == "Q4_0" || type == "Q4_1") {
    const float d = f16(b);
    const uint8_t* qs = b + (type == "Q4_0" ? 2 : 4);
    scales[0] = d;
    offsets[0] = type == "Q4_0" ? -8.0f * d : f16(b + 2);
    for (int l = 0; l < 16; ++l) {
      codes[l] = qs[l] & 0x0F;
      codes[l + 16] = qs[l] >> 4;
    }
  } else if (type == "Q5_0" || type == "Q5_1") {
    const bool q5_0 = type == "Q5_0";
    const uint8_t* qh_bytes = b + (q5_0 ? 2 : 4);
    const uint8_t* qs = qh_bytes + 4;
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    scales[0] = f16(b);
    if (!q5_0) offsets[0] = f16(b + 2);
    for (int l = 0; l < 16; ++l) {
      codes[l] = ((qs[l] & 0x0F) | (((qh >> l) & 1) << 4)) - (q5_0 ? 16 : 0);
      codes[l + 16] = ((qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - (q5_0 ? 16 : 0);
    }
  } else if (type == "Q4_K" || type == "Q5_K") {
    const bool q5 = type == "Q5_K";
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* packed_scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (q5 ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      k_scale_min(packed_scales, j, sc, mn);
      scales[j] = d * static_cast<float>(sc);
      offsets[j] = -(dmin * static_cast<float>(mn));
    }
    for (int v = 0; v < QK_K; ++v) {
      const int chunk = v / 64, within = v % 64;
      const uint8_t byte = qs[32 * chunk + within % 32];
      int32_t code = within < 32 ? (byte & 0x0F) : (byte >> 4);
      if (q5) code |= ((qh[v % 32] >> (v / 32)) & 1) << 4;
      codes[v] = code;
    }
  } else {  // Q6_K
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int g = 0; g < 16; ++g) scales[g] = d * static_cast<float>(sc[g]);
    for (int v = 0; v < QK_K; ++v) {
      const int h = v / 128, r = v % 128;
      const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
      codes[v] = (low | (high << 4)) - 32;
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t> gguf_pack(const at::Tensor& raw, const std::string& type_name,
                                                                          const at::Tensor& row_ids, int64_t in_features) {
  TypeInfo info;
  TORCH_CHECK(type_info(type_name, info), "gguf_pack: GGUF type ", type_name, " is not packed here");
  const int64_t K = in_features;
  TORCH_CHECK(K > 0 && K % info.block_values == 0, "gguf_pack: ", type_name, " rows are whole blocks of ", info.block_values,
              " values; in_features is ", K);
  const int64_t row_bytes = K / info.block_values * info.block_bytes;
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.size(1) == row_bytes,
              "gguf_pack: raw must be contiguous uint8 [rows, ", row_bytes, "] for ", K, " ", type_name, " values a row");
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.scalar_type() == at::kLong && row_ids.is_contiguous(), "gguf_pack: row_ids must be int64 [N]");
  const int64_t num_rows = raw.size(0), N = row_ids.size(0);
  const int64_t* ids = row_ids.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(ids[n] >= 0 && ids[n] < num_rows, "gguf_pack: row id ", ids[n], " outside ", num_rows, " rows");
  const int64_t NB = (N + COLS - 1) / COLS, NG = K / info.group;
  const int64_t k_per_load = info.bits == 4 ? 8 : 4;  // k in one 4-byte lane of a column
  const auto u8 = raw.options();
  at::Tensor values = at::empty({NB, K / k_per_load, COLS, 4}, u8);
  at::Tensor scales = at::zeros({NB, NG, COLS}, u8.dtype(at::kFloat));
  at::Tensor offsets = info.offsets ? at::zeros({NB, NG, COLS}, u8.dtype(at::kFloat)) : at::empty({0}, u8.dtype(at::kFloat));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* vp = values.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
  float* op = info.offsets ? offsets.data_ptr<float>() : nullptr;
  const int64_t groups_per_block = info.block_values / info.group;
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> codes(static_cast<size_t>(K) * COLS);  // this block's [K, 16] codes
    int32_t block_codes[QK_K];
    float block_scales[16], block_offsets[16];
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(codes.begin(), codes.end(), 0);
      for (int64_t j = 0; j < COLS; ++j) {
        const int64_t n = b * COLS + j;
        if (n >= N) break;
        const uint8_t* row = src + ids[n] * row_bytes;
        for (int64_t blk = 0; blk < K / info.block_values; ++blk) {
          decode_block(type_name, row + blk * info.block_bytes, block_codes, block_scales, block_offsets);
          for (int64_t v = 0; v < info.block_values; ++v) codes[(blk * info.block_values + v) * COLS + j] = block_codes[v];
          for (int64_t g = 0; g < groups_per_block; ++g) {
            const int64_t group = blk * groups_per_block + g;
            sp[(b * NG + group) * COLS + j] = block_scales[g];
            if (op != nullptr) op[(b * NG + group) * COLS + j] = block_offsets[g];
          }
        }
      }
      uint8_t* out = vp + b * (K / k_per_load) * COLS * 4;
      for (int64_t p = 0; p < K / k_per_load; ++p)
        for (int64_t j = 0; j < COLS; ++j)
          for (int64_t i = 0; i < 4; ++i) {
            uint8_t byte;
            if (info.bits == 4) {
              byte = static_cast<uint8_t>(codes[(8 * p + i) * COLS + j] | (codes[(8 * p + 4 + i) * COLS + j] << 4));
            } else {
              byte = static_cast<uint8_t>(codes[(4 * p + i) * COLS + j] + 128);
            }
            out[(p * COLS + j) * 4 + i] = byte;
          }
    }
  });
  return {values, scales, offsets, info.bits, info.group};
}

bool gguf_pack_supports(const std::string& type_name) {
  TypeInfo info;
  return type_info(type_name, info);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("gguf_pack_supports(str type_name) -> bool", &gguf_pack_supports);
  m.def("gguf_pack(Tensor raw, str type_name, Tensor row_ids, int in_features) -> (Tensor, Tensor, Tensor, int, int)", &gguf_pack);
}
