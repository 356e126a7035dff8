// What this CPU does per second under load, measured, for benchmarks/bench_model.py's peak line:
//
//   zserve::probe_rate(str what, int iterations) -> float   (summed over every thread, all running at once)
//
//   "clock"       cycles per second per thread: a chain of dependent 64-bit adds (one cycle each)
//   "fma"         fp32 FLOP/s of VFMADD231PS at the build's width (ymm at avx2, zmm at avx512+)
//   "vdpbf16ps"   FLOP/s of VDPBF16PS zmm (2 bf16 products per fp32 lane), the zserve_bf16 GEMM's
//   "vpdpbusd"    int8 ops/s of VPDPBUSD (4 u8 x s8 products per int32 lane) as zserve_int8_dot uses it: zmm
//                 with avx512_vnni, ymm (AVX-VNNI) in a 256-bit build with avx_vnni, else 0
//   "vpmaddubsw"  int8 ops/s of VPMADDUBSW + VPMADDWD + VPADDD at the build's width (zserve_int8_dot's
//                 sequence without VNNI)
//
// Each throughput loop keeps 12 independent accumulators (enough to cover the latency of two
// ports); a product counts 2 ops (multiply and add). 0 where the build lacks the instruction.

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

constexpr int ACCUMULATORS = 12;

#if defined(__x86_64__)
double clock_hz(int64_t iterations) {
  uint64_t x = 0;
  const uint64_t one = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    asm volatile(
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        : "+r"(x)
        : "r"(one));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return x == 0 ? 0.0 : 16.0 * static_cast<double>(iterations) / seconds;
}
#else
double clock_hz(int64_t) { return 0.0; }
#endif

// ops/s of `step(acc[j])` over ACCUMULATORS independent accumulators, `ops` per step.
template <typename V, typename Step, typename Sink>
double throughput(int64_t iterations, double ops, V init, Step step, Sink sink) {
  V acc[ACCUMULATORS];
  for (auto& a : acc) a = init;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = step(a);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& a : acc) sink(a);
  return ops * ACCUMULATORS * static_cast<double>(iterations) / seconds;
}

volatile float float_sink;
volatile int int_sink;

double one_thread_rate(const std::string& what, int64_t iterations) {
  if (what == "clock") return clock_hz(iterations);
#if defined(__AVX512F__)
  const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-7f);
  auto fsink = [](__m512 v) { float_sink = _mm512_reduce_add_ps(v); };
  auto isink = [](__m512i v) { int_sink = _mm512_reduce_add_epi32(v); };
  if (what == "fma") return throughput(iterations, 32, a, [&](__m512 v) { return _mm512_fmadd_ps(v, a, b); }, fsink);
#if defined(__AVX512BF16__)
  const __m512bh pairs = _mm512_cvtne2ps_pbh(a, b);
  if (what == "vdpbf16ps") return throughput(iterations, 64, b, [&](__m512 v) { return _mm512_dpbf16_ps(v, pairs, pairs); }, fsink);
#endif
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2), ones = _mm512_set1_epi16(1);
#if defined(__AVX512VNNI__)
  if (what == "vpdpbusd") return throughput(iterations, 128, _mm512_setzero_si512(), [&](__m512i v) { return _mm512_dpbusd_epi32(v, u, s); }, isink);
#endif
  if (what == "vpmaddubsw")
    return throughput(iterations, 128, _mm512_setzero_si512(),
                      [&](__m512i v) { return _mm512_add_epi32(v, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), ones)); }, isink);
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-7f);
  auto fsink = [](__m256 v) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    float_sink = lanes[0];
  };
  auto isink = [](__m256i v) { int_sink = _mm256_extract_epi32(v, 0); };
  if (what == "fma") return throughput(iterations, 16, a, [&](__m256 v) { return _mm256_fmadd_ps(v, a, b); }, fsink);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
#if defined(__AVXVNNI__)
  if (what == "vpdpbusd")
    return throughput(iterations, 64, _mm256_setzero_si256(), [&](__m256i v) { return _mm256_dpbusd_avx_epi32(v, u, s); }, isink);
#endif
  if (what == "vpmaddubsw")
    return throughput(iterations, 64, _mm256_setzero_si256(),
                      [&](__m256i v) { return _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones)); }, isink);
#endif
  return 0.0;
}

double probe_rate(const std::string& what, int64_t iterations) {
  TORCH_CHECK(what == "clock" || what == "fma" || what == "vdpbf16ps" || what == "vpdpbusd" || what == "vpmaddubsw",
              "probe_rate: expected clock, fma, vdpbf16ps, vpdpbusd or vpmaddubsw, got ", what);
  TORCH_CHECK(iterations > 0, "probe_rate: iterations must be positive");
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rates[t] = one_thread_rate(what, iterations);
  });
  double total = 0.0;
  for (double r : rates) total += r;
  return what == "clock" ? total / threads : total;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zserve, m) { m.def("probe_rate(str what, int iterations) -> float", &probe_rate); }
