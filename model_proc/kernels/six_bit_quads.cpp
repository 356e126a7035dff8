// 6-bit codes (six_bit_codes.h) expanded to gemm_int8_dot.cpp's int8 quad layout, through the
// header's `expand_to_quads` (the function a kernel that reads quads, such as an AMX-INT8 tile
// fill, calls on a k range of one column block); tests/model/test_six_bit_codes.py holds it to the
// torch packing:
//
//   zserve::six_bit_quads(codes) -> quads
//
//   codes  uint8 [NB, 3K / 16, 16, 4]   C + 32 of int8 codes C, in units of 16 k
//   quads  uint8 [NB, K / 4, 16, 4]     C + 128 (pack_int8_quads's layout)

#include <torch/library.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "six_bit_codes.h"

namespace {

at::Tensor six_bit_quads(const at::Tensor& codes) {
  using namespace zserve_six_bit;
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(1) % 3 == 0 &&
                  codes.size(2) == COLS && codes.size(3) == 4,
              "six_bit_quads: codes must be contiguous uint8 [NB, 3K / 16, 16, 4]");
  const int64_t num_blocks = codes.size(0), K = codes.size(1) / 3 * K_PER_UNIT;
  at::Tensor quads = at::empty({num_blocks, K / 4, COLS, 4}, codes.options());
  const uint8_t* src = codes.data_ptr<uint8_t>();
  uint8_t* dst = quads.data_ptr<uint8_t>();
  at::parallel_for(0, num_blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) expand_to_quads(src + b * block_bytes(K), 0, K, dst + b * K * COLS);
  });
  return quads;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) { m.def("six_bit_quads(Tensor codes) -> Tensor", &six_bit_quads); }
