// A mixture-of-experts layer's routed experts in one call (layers/stacked_experts.py), over a GGUF
// file's stacked expert matrices packed once per layer by gguf_pack.cpp:
//
//   zserve::moe_experts(x, expert_ids, weights, gate_up, gate_up_bits, gate_up_group,
//                       down, down_bits, down_group, num_experts,
//                       gate_up_implied_offset=0, down_implied_offset=0) -> y
//
//   x            bf16 or fp32 [T, H]     contiguous
//   expert_ids   int64 [T, k]            the router's choice (layers/router.py)
//   weights      x's dtype [T, k]        the router's weights
//   gate_up      [codes, scale_supers, scale_subs, offset_supers, offset_subs]: every expert's
//                [H, 2I] weight (gate's I columns, then up's), its column blocks expert after expert:
//                codes uint8 [E * NB, H / 8, 3H / 16 or H / 4, 16, 4] (4-, 6- or 8-bit), the scales as
//                gemm_dot_compact takes them ([E * NB, ...]); an absent part (subs, offsets) is an empty
//                tensor, and a type of one group per super has its implied offset factor (Q4_0: -8)
//   down         likewise, every expert's [I, H] weight
//   y            x's dtype [T, H]
//
// The arithmetic is layers/fused_experts.py's loop, step for step, with its kernels: the T x k
// (token, expert) pairs sorted by expert (stable), per expert hit one gemm_dot_compact for gate_up
// on its rows, silu_mul (fused_ops.cpp), one gemm_dot_compact for down; then each pair's output
// times its weight, and the k of a token summed. Expert e's weight is its NB column blocks, a view
// (no copy): the loop's Python per expert (module calls, slicing, the kernel's dispatch) is gone,
// its results are bit-identical (tests/model/test_gguf_moe.py). The GEMMs are the ones every other
// GGUF matrix runs (gemm_int8_dot.cpp, whatever instructions its build has), called through the
// dispatcher: this file holds no instruction of its own and builds for every feature set.

#include <torch/library.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

using CompactFn = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t,
                           const std::optional<at::Tensor>&, int64_t, int64_t);
using Compact = c10::TypedOperatorHandle<CompactFn>;

// One projection's stacked weight: expert e's view is blocks [e * NB, (e + 1) * NB) of each part.
struct Stacked {
  at::Tensor codes, scale_supers;
  std::optional<at::Tensor> scale_subs, offset_supers, offset_subs;  // absent: one group per super, no offsets
  int64_t bits, group, implied_offset, blocks_per_expert, out_features;

  Stacked(const char* name, const std::vector<at::Tensor>& parts, int64_t bits_, int64_t group_, int64_t implied_offset_,
          int64_t num_experts)
      : bits(bits_), group(group_), implied_offset(implied_offset_) {
    TORCH_CHECK(parts.size() == 5, "moe_experts: ", name, " must be [codes, scale_supers, scale_subs, offset_supers, offset_subs]");
    codes = parts[0];
    scale_supers = parts[1];
    if (parts[2].numel() > 0) scale_subs = parts[2];
    if (parts[3].numel() > 0) offset_supers = parts[3];
    if (parts[4].numel() > 0) offset_subs = parts[4];
    TORCH_CHECK(codes.dim() == 4 && codes.size(0) % num_experts == 0, "moe_experts: ", name,
                " codes must be [E * NB, K / 8, 3K / 16 or K / 4, 16, 4]");
    for (const std::optional<at::Tensor>& part : {std::optional<at::Tensor>(scale_supers), scale_subs, offset_supers, offset_subs})
      TORCH_CHECK(!part.has_value() || (part->dim() == 3 && part->size(0) == codes.size(0)), "moe_experts: ", name,
                  " scales and offsets must be [E * NB, ..., 16]");
    blocks_per_expert = codes.size(0) / num_experts;
    out_features = blocks_per_expert * codes.size(2);
  }

  static at::Tensor blocks(const at::Tensor& t, int64_t e, int64_t n) { return t.narrow(0, e * n, n); }

  at::Tensor matmul(const Compact& gemm, const at::Tensor& x, int64_t e) const {
    const int64_t n = blocks_per_expert;
    std::optional<at::Tensor> scale_subs_e, offset_supers_e, offset_subs_e;
    if (scale_subs.has_value()) scale_subs_e = blocks(*scale_subs, e, n);
    if (offset_supers.has_value()) offset_supers_e = blocks(*offset_supers, e, n);
    if (offset_subs.has_value()) offset_subs_e = blocks(*offset_subs, e, n);
    return gemm.call(x, blocks(codes, e, n), bits, blocks(scale_supers, e, n), scale_subs_e, offset_supers_e,
                     offset_subs_e, out_features, std::nullopt, group, implied_offset);
  }
};

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                       const std::vector<at::Tensor>& gate_up, int64_t gate_up_bits, int64_t gate_up_group,
                       const std::vector<at::Tensor>& down, int64_t down_bits, int64_t down_group, int64_t num_experts,
                       int64_t gate_up_implied_offset, int64_t down_implied_offset) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "moe_experts: x must be contiguous float32 or bfloat16 [T, H]");
  TORCH_CHECK(expert_ids.dim() == 2 && expert_ids.size(0) == x.size(0) && expert_ids.scalar_type() == at::kLong,
              "moe_experts: expert_ids must be int64 [T, k]");
  TORCH_CHECK(weights.sizes() == expert_ids.sizes(), "moe_experts: weights must be shaped like expert_ids");
  TORCH_CHECK(num_experts > 0, "moe_experts: num_experts must be positive");
  const Stacked gu("gate_up", gate_up, gate_up_bits, gate_up_group, gate_up_implied_offset, num_experts);
  const Stacked dn("down", down, down_bits, down_group, down_implied_offset, num_experts);
  TORCH_CHECK(dn.out_features == x.size(1) && gu.out_features % 2 == 0,
              "moe_experts: down must have H columns and gate_up 2I (whole 16-column blocks)");
  static const auto gemm = c10::Dispatcher::singleton().findSchemaOrThrow("zserve::gemm_dot_compact", "").typed<CompactFn>();
  static const auto silu_mul =
      c10::Dispatcher::singleton().findSchemaOrThrow("zserve::silu_mul", "").typed<at::Tensor(const at::Tensor&)>();
  const int64_t num_tokens = expert_ids.size(0), top_k = expert_ids.size(1);
  const at::Tensor flat_ids = expert_ids.reshape({-1});
  const at::Tensor order = at::argsort(flat_ids, /*stable=*/true);  // pairs grouped by expert, tokens ascending
  const at::Tensor rows = at::floor_divide(order, top_k);
  const at::Tensor counts = at::bincount(flat_ids, /*weights=*/{}, num_experts);
  TORCH_CHECK(counts.size(0) == num_experts, "moe_experts: an expert id is out of range");
  const int64_t* count = counts.data_ptr<int64_t>();
  const at::Tensor xs = x.index_select(0, rows);
  at::Tensor ys = at::empty_like(xs);
  int64_t start = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] == 0) continue;
    const at::Tensor rows_e = xs.narrow(0, start, count[e]);
    const at::Tensor act = silu_mul.call(gu.matmul(gemm, rows_e, e));  // [n, 2I] -> [n, I]
    ys.narrow(0, start, count[e]).copy_(dn.matmul(gemm, act, e));
    start += count[e];
  }
  const at::Tensor scaled = ys * weights.reshape({-1, 1}).index_select(0, order);
  at::Tensor pairs = at::empty_like(scaled);
  pairs.index_put_({order}, scaled);  // back to (token, k) order
  return pairs.view({num_tokens, top_k, -1}).sum(1).to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("moe_experts(Tensor x, Tensor expert_ids, Tensor weights, Tensor[] gate_up, int gate_up_bits, int gate_up_group, "
        "Tensor[] down, int down_bits, int down_group, int num_experts, int gate_up_implied_offset=0, "
        "int down_implied_offset=0) -> Tensor",
        &moe_experts);
}
