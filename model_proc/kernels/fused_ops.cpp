// The elementwise steps of a Llama-family layer, one call each instead of 4-8 torch ops, for
// CPU tensors in float32 or bfloat16. Each rounds where the torch ops it replaces round (and so
// where transformers does), so outputs match them up to the last bit of fp32 intermediates:
//
//   zserve::rms_norm(x, weight, eps) -> y
//       y = dtype(dtype(x * rsqrt(mean(x^2) + eps)) * weight), statistics in fp32
//   zserve::add_rms_norm_(x, residual, weight, eps) -> y
//       residual <- dtype(residual + x) (in place), then y = rms_norm(residual)
//   zserve::silu_mul(gate_up) -> y
//       gate_up [T, 2I] = [gate | up]: y = dtype(dtype(silu(gate)) * up)
//   zserve::rope_store(qk, v, cos, sin_signed, k_cache, v_cache, out_slots, num_q_heads) -> q
//       qk [T, h + kvh, d] (q heads, then k heads), v [T, kvh, d], cos/sin_signed [T, r] in
//       the dtype (r = rotary dims, even, <= d): rotated = dtype(dtype(x * cos) +
//       dtype(swap_halves(x) * sin_signed)) over the first r dims of each head (NeoX layout, as
//       model_proc/layers/rotary.py), dims r..d-1 copied (a partial rotary); returns rotated q
//       [T, h, d] and writes rotated k and v at out_slots of k_cache/v_cache [kvh, slots, d]; fp8 caches
//       (float8_e4m3fn or float8_e5m2, --kv-cache-dtype fp8_e4m3 / fp8_e5m2, scale 1.0) take each row rounded to
//       the dtype first, then clamped to the format's finite range and converted to nearest even (cpu_math.h's
//       narrow_fp8_row; kv_fp8.py's to_fp8, what KVPool.write stores, gives the same bytes)
//   zserve::rope_store_int8(qk, v, cos, sin_signed, k_cache, v_cache, k_scales, v_scales, out_slots, num_q_heads) -> q
//       the same into an int8 cache (--kv-cache-dtype int8): each k and v row, rounded to the dtype
//       first (what rope_store would have stored), goes in as int8 with its scale at k/v_scales
//       bf16 [kvh, slots] (cpu_math.h's quantize_int8_row_bf16_scale; kv_int8.py's quantize_rows is the same)
//
// In bf16 every product is rounded to the dtype before the sum, as in the torch ops; in fp32 the
// compiler may fuse a product and a sum into one FMA (one rounding instead of two: an ulp).
// Rows (tokens) are split over threads only when there are enough of them to pay for it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "cpu_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>


namespace {

constexpr int64_t GRAIN_ELEMENTS = 1 << 15;  // elements per thread below which a call stays on one thread

// Rows go through fp32 buffers: widen (16 at a time), compute in plain float loops that
// vectorize, narrow back with round-to-nearest-even. c10::BFloat16's own conversions would keep
// every loop scalar (10x slower than the torch ops here).
template <typename T>
inline void widen(const T* src, float* dst, int64_t n) { zserve_cpu::widen_row(src, dst, n); }
inline void narrow(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void narrow(const float* src, c10::BFloat16* dst, int64_t n) { zserve_cpu::narrow_row(src, dst, n); }

// x rounded to T's precision and back (round to nearest even), in integer ops that vectorize;
// inputs are finite here.
template <typename T>
inline float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return zserve_cpu::round_to_bf16(x);
  }
}



// f(float{}) or f(c10::BFloat16{}): the callers' dtypes (checked before)
template <typename F>
void dispatch(at::ScalarType dtype, const F& f) {
  if (dtype == at::kFloat) {
    f(float{});
  } else {
    f(c10::BFloat16{});
  }
}

template <typename F>
void for_rows(int64_t num_rows, int64_t row_elements, const F& body) {
  const int64_t grain = std::max<int64_t>(1, GRAIN_ELEMENTS / std::max<int64_t>(1, row_elements));
  if (num_rows <= grain) {
    body(0, num_rows);
  } else {
    at::parallel_for(0, num_rows, grain, body);
  }
}

// y = dtype(dtype(x * rsqrt(mean(x^2) + eps)) * w) for one row; buf holds 2n floats, w_f the weight in fp32
template <typename T>
void rms_norm_row(const T* x, const float* __restrict w_f, T* y, int64_t n, float eps, float* __restrict buf) {
  float* __restrict xf = buf;
  float* __restrict yf = buf + n;
  widen(x, xf, n);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += xf[i] * xf[i];
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) yf[i] = round_to<T>(xf[i] * r) * w_f[i];
  narrow(yf, y, n);
}

// gate <- dtype(silu(gate)) * up, in place
template <typename T>
void silu_mul_row(float* __restrict gate, const float* __restrict up, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = gate[i];
    gate[i] = round_to<T>(v / (1.0f + zserve_cpu::exp_poly(-v))) * up[i];
  }
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16), name,
              ": float32 or bfloat16 CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, ": [T, n] with contiguous rows");
}

// y = rms_norm(residual + x) with residual updated in place, or rms_norm(x) when residual is null
at::Tensor norm_rows(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight, double eps, const char* name) {
  check_rows(x, name);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(), name, ": weight [n] in x's dtype");
  if (residual != nullptr) {
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), name,
                ": residual is contiguous, shaped and typed like x");
  }
  const int64_t T = x.size(0), n = x.size(1);
  at::Tensor y = at::empty({T, n}, x.options());
  dispatch(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual != nullptr ? residual->data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t ldx = x.stride(0);
    std::vector<float> w_f(n);
    widen(weight.data_ptr<scalar_t>(), w_f.data(), n);
    for_rows(T, n, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(4 * n);
      float* rf = buf.data() + 2 * n;
      float* xf = buf.data() + 3 * n;
      for (int64_t t = t0; t < t1; ++t) {
        if (rp == nullptr) {
          rms_norm_row(xp + t * ldx, w_f.data(), yp + t * n, n, static_cast<float>(eps), buf.data());
          continue;
        }
        scalar_t* r = rp + t * n;
        widen(r, rf, n);
        widen(xp + t * ldx, xf, n);
        _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) rf[i] += xf[i];
        narrow(rf, r, n);  // the sum rounded to the dtype, then normalised from there
        rms_norm_row(r, w_f.data(), yp + t * n, n, static_cast<float>(eps), buf.data());
      }
    });
  });
  return y;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) { return norm_rows(x, nullptr, weight, eps, "rms_norm"); }

at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor residual, const at::Tensor& weight, double eps) {
  return norm_rows(x, &residual, weight, eps, "add_rms_norm_");
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "silu_mul");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_mul: [T, 2I]");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor y = at::empty({T, I}, gate_up.options());
  dispatch(gate_up.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* gp = gate_up.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t ld = gate_up.stride(0);
    for_rows(T, 2 * I, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(2 * I);
      float* __restrict gf = buf.data();
      float* __restrict uf = gf + I;
      for (int64_t t = t0; t < t1; ++t) {
        widen(gp + t * ld, gf, 2 * I);
        silu_mul_row<scalar_t>(gf, uf, I);
        narrow(gf, yp + t * I, I);
      }
    });
  });
  return y;
}

// n fp32 values into an fp8 cache (e4m3, else e5m2) at element `offset`
inline void narrow_fp8(bool e4m3, const float* src, void* cache, int64_t offset, int64_t n) {
  if (e4m3) {
    zserve_cpu::narrow_fp8_row(src, static_cast<c10::Float8_e4m3fn*>(cache) + offset, n);
  } else {
    zserve_cpu::narrow_fp8_row(src, static_cast<c10::Float8_e5m2*>(cache) + offset, n);
  }
}

// k_scales / v_scales: undefined for a cache of qk's dtype or an fp8 one, fp32 [kvh, slots] for an int8 one
at::Tensor rope_store_into(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin_signed,
                           at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k_scales, const at::Tensor& v_scales,
                           const at::Tensor& out_slots, int64_t num_q_heads) {
  const bool int8_cache = k_scales.defined();
  const bool fp8_cache = !int8_cache && (k_cache.scalar_type() == at::kFloat8_e4m3fn || k_cache.scalar_type() == at::kFloat8_e5m2);
  const bool e4m3 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  const at::ScalarType cache_dtype = int8_cache ? at::kChar : fp8_cache ? k_cache.scalar_type() : qk.scalar_type();
  TORCH_CHECK(qk.dim() == 3 && v.dim() == 3 && qk.stride(2) == 1 && v.stride(2) == 1, "rope_store: qk, v [T, heads, d], d contiguous");
  TORCH_CHECK(qk.scalar_type() == v.scalar_type() && qk.scalar_type() == cos.scalar_type() && qk.scalar_type() == sin_signed.scalar_type() &&
                  k_cache.scalar_type() == cache_dtype && v_cache.scalar_type() == cache_dtype,
              "rope_store: one dtype for qk, v, cos, sin and the caches (int8 caches for rope_store_int8, fp8 ones of one format)");
  TORCH_CHECK(qk.scalar_type() == at::kFloat || qk.scalar_type() == at::kBFloat16, "rope_store: float32 or bfloat16");
  const int64_t T = qk.size(0), d = qk.size(2), h = num_q_heads, kvh = qk.size(1) - num_q_heads;
  TORCH_CHECK(kvh >= 1 && v.size(0) == T && v.size(1) == kvh && v.size(2) == d && d % 2 == 0, "rope_store: qk holds h + kvh heads, v kvh");
  const int64_t r = T > 0 ? cos.numel() / T : d;  // rotary dims
  TORCH_CHECK(cos.is_contiguous() && sin_signed.is_contiguous() && r % 2 == 0 && r <= d && cos.numel() == T * r &&
                  sin_signed.numel() == T * r,
              "rope_store: cos, sin [T, r], r even and <= d");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(0) == kvh && k_cache.size(2) == d,
              "rope_store: caches [kvh, slots, d], contiguous");
  TORCH_CHECK(out_slots.scalar_type() == at::kLong && out_slots.is_contiguous() && out_slots.numel() == T, "rope_store: out_slots int64[T]");
  const int64_t num_slots = k_cache.size(1);
  if (int8_cache) {
    for (const at::Tensor* t : {&k_scales, &v_scales}) {
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 2 && t->size(0) == kvh && t->size(1) == num_slots,
                  "rope_store_int8: scales bf16 [kvh, slots], contiguous");
    }
  }
  const int64_t* slots = out_slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "rope_store: slot ", slots[t], " outside the cache");
  at::Tensor q = at::empty({T, h, d}, qk.options());
  dispatch(qk.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    using T_ = scalar_t;
    const T_* qkp = qk.data_ptr<T_>();
    const T_* vp = v.data_ptr<T_>();
    const T_* cp = cos.data_ptr<T_>();
    const T_* sp = sin_signed.data_ptr<T_>();
    T_* qp = q.data_ptr<T_>();
    T_* kc = int8_cache || fp8_cache ? nullptr : k_cache.data_ptr<T_>();
    T_* vc = int8_cache || fp8_cache ? nullptr : v_cache.data_ptr<T_>();
    void* k8 = fp8_cache ? k_cache.data_ptr() : nullptr;
    void* v8 = fp8_cache ? v_cache.data_ptr() : nullptr;
    int8_t* kq = int8_cache ? k_cache.data_ptr<int8_t>() : nullptr;
    int8_t* vq = int8_cache ? v_cache.data_ptr<int8_t>() : nullptr;
    c10::BFloat16* ks = int8_cache ? k_scales.data_ptr<c10::BFloat16>() : nullptr;
    c10::BFloat16* vs = int8_cache ? v_scales.data_ptr<c10::BFloat16>() : nullptr;
    const int64_t half = r / 2, qk_t = qk.stride(0), qk_h = qk.stride(1), v_t = v.stride(0), v_h = v.stride(1);
    for_rows(T, (h + 2 * kvh) * d, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(2 * r + 2 * d);
      float* __restrict cf = buf.data();
      float* __restrict sf = cf + r;
      float* __restrict xf = sf + r;
      float* __restrict of = xf + d;
      for (int64_t t = t0; t < t1; ++t) {
        widen(cp + t * r, cf, r);
        widen(sp + t * r, sf, r);
        for (int64_t head = 0; head < h + kvh; ++head) {
          widen(qkp + t * qk_t + head * qk_h, xf, d);
          _Pragma("omp simd") for (int64_t i = 0; i < half; ++i) {
            of[i] = round_to<T_>(xf[i] * cf[i]) + round_to<T_>(xf[i + half] * sf[i]);
            of[i + half] = round_to<T_>(xf[i + half] * cf[i + half]) + round_to<T_>(xf[i] * sf[i + half]);
          }
          std::memcpy(of + r, xf + r, (d - r) * sizeof(float));  // a partial rotary's pass-through dims
          const int64_t row = (head - h) * num_slots + slots[t];  // a k head's row in the cache
          if (head < h) {
            narrow(of, qp + (t * h + head) * d, d);
          } else if (int8_cache) {
            _Pragma("omp simd") for (int64_t i = 0; i < d; ++i) of[i] = round_to<T_>(of[i]);
            ks[row] = zserve_cpu::quantize_int8_row_bf16_scale(of, kq + row * d, d);
          } else if (fp8_cache) {
            _Pragma("omp simd") for (int64_t i = 0; i < d; ++i) of[i] = round_to<T_>(of[i]);
            narrow_fp8(e4m3, of, k8, row * d, d);
          } else {
            narrow(of, kc + row * d, d);
          }
        }
        for (int64_t head = 0; head < kvh; ++head) {
          const int64_t row = head * num_slots + slots[t];
          if (int8_cache) {
            widen(vp + t * v_t + head * v_h, xf, d);
            vs[row] = zserve_cpu::quantize_int8_row_bf16_scale(xf, vq + row * d, d);
          } else if (fp8_cache) {
            widen(vp + t * v_t + head * v_h, xf, d);
            narrow_fp8(e4m3, xf, v8, row * d, d);
          } else {
            std::memcpy(vc + row * d, vp + t * v_t + head * v_h, d * sizeof(T_));
          }
        }
      }
    });
  });
  return q;
}

at::Tensor rope_store(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin_signed,
                      at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& out_slots, int64_t num_q_heads) {
  return rope_store_into(qk, v, cos, sin_signed, k_cache, v_cache, at::Tensor(), at::Tensor(), out_slots, num_q_heads);
}

at::Tensor rope_store_int8(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin_signed,
                           at::Tensor k_cache, at::Tensor v_cache, at::Tensor k_scales, at::Tensor v_scales,
                           const at::Tensor& out_slots, int64_t num_q_heads) {
  TORCH_CHECK(k_scales.defined() && v_scales.defined(), "rope_store_int8: scales required");
  return rope_store_into(qk, v, cos, sin_signed, k_cache, v_cache, k_scales, v_scales, out_slots, num_q_heads);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor", &add_rms_norm_);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("rope_store(Tensor qk, Tensor v, Tensor cos, Tensor sin_signed, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor out_slots, int num_q_heads) -> Tensor",
        &rope_store);
  m.def("rope_store_int8(Tensor qk, Tensor v, Tensor cos, Tensor sin_signed, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor(c!) k_scales, Tensor(d!) v_scales, Tensor out_slots, int num_q_heads) -> Tensor",
        &rope_store_int8);
}
