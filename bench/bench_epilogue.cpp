// What fusing an element pass into a product would gain, one core, the LM's MLP half-products
// ([1024, 256] x [256, 1024] and its kin: one core's half of [2048, 256] x [256, 1024]), operands
// pushed out of the caches before each call, variants interleaved within each repetition:
//   1. tessel's packed_gemm against dnnl_sgemm (the kernel an epilogue could live in);
//   2. GELU as its own pass after the product against per-row-block interleaving (the product
//      on 128 or 256 rows, then GELU on them while they are in cache);
//   3. oneDNN's matmul primitive against dnnl_sgemm, and with a binary_mul post-op (GELU's
//      gradient dY * gelu'(h)) against dnnl_sgemm plus a separate multiply pass.
// Usage: bench_epilogue [REPS]   (default 40; prints one JSON object per comparison: medians, ms)
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "tessel/ops/detail/packed_gemm.h"
#include "tessel/ops/detail/vmath.h"

extern "C" void omp_set_num_threads(int threads);  // libgomp, which oneDNN runs on

namespace {

using Clock = std::chrono::steady_clock;
namespace detail = tessel::ops::detail;

// Medians over `reps` repetitions of each variant, the variants' order rotating each repetition.
std::vector<double> interleaved(int reps, const std::vector<std::function<void()>>& variants) {
  static std::vector<float> flush(size_t{64} << 18, 1.0f);  // 64 MiB: more than the L2 and the L3 share
  std::vector<std::vector<double>> times(variants.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t j = 0; j < variants.size(); ++j) {
      const size_t v = (j + static_cast<size_t>(rep)) % variants.size();
      for (float& x : flush) x += 1.0f;
      const auto t0 = Clock::now();
      variants[v]();
      times[v].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

std::vector<float> filled(int64_t n, int mod, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % static_cast<size_t>(mod))) * step;
  return v;
}

void sgemm(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  if (dnnl_sgemm('N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, k, b, trans_b ? k : n, 0.0f, c, n) != dnnl_success) {
    std::fprintf(stderr, "dnnl_sgemm failed\n");
    std::exit(1);
  }
}

void kernels(int reps) {
  if (!detail::packed_gemm_supported()) {
    std::printf("{\"case\": \"packed_gemm\", \"skipped\": \"this CPU has neither AVX-512F nor AVX2 with FMA\"}\n");
    return;
  }
  struct Shape {
    int64_t m, n, k;
    bool trans_b;
  };
  for (const Shape s : {Shape{1024, 1024, 256, false}, Shape{1024, 1024, 256, true}, Shape{1024, 256, 1024, false},
                        Shape{1024, 256, 256, false}}) {
    const auto a = filled(s.m * s.k, 89, 1e-3f), b = filled(s.k * s.n, 83, 2e-3f);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    const auto t = interleaved(reps, {[&] { sgemm(s.trans_b, s.m, s.n, s.k, a.data(), b.data(), c.data()); },
                                      [&] {
                                        detail::packed_gemm(false, s.trans_b, s.k, s.n, b.data(),
                                                            {{s.m, a.data(), c.data()}});
                                      }});
    std::printf("{\"case\": \"packed_gemm against dnnl_sgemm\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"trans_b\": %s, "
                "\"dnnl_sgemm_ms\": %.3f, \"packed_gemm_ms\": %.3f, \"ratio\": %.3f}\n",
                static_cast<long>(s.m), static_cast<long>(s.n), static_cast<long>(s.k), s.trans_b ? "true" : "false",
                t[0], t[1], t[1] / t[0]);
  }
}

void row_blocks(int reps) {
  const int64_t m = 1024, n = 1024, k = 256;
  const auto a = filled(m * k, 97, 1e-3f), b = filled(k * n, 83, 2e-3f);
  std::vector<float> h(static_cast<size_t>(m * n)), y(h.size());
  auto blocked = [&](int64_t rows) {
    for (int64_t r = 0; r < m; r += rows) {
      sgemm(false, rows, n, k, a.data() + r * k, b.data(), h.data() + r * n);
      detail::gelu_f32(h.data() + r * n, y.data() + r * n, rows * n);
    }
  };
  const auto t = interleaved(reps, {[&] { sgemm(false, m, n, k, a.data(), b.data(), h.data()); }, [&] { blocked(m); },
                                    [&] { blocked(128); }, [&] { blocked(256); }});
  std::printf("{\"case\": \"GELU after the product\", \"product_ms\": %.3f, \"two_passes_ms\": %.3f, "
              "\"blocks_of_128_rows_ms\": %.3f, \"blocks_of_256_rows_ms\": %.3f}\n",
              t[0], t[1], t[2], t[3]);
}

void matmul_primitive(int reps) {
  using namespace dnnl;
  const int64_t m = 1024, n = 1024, k = 256;
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const memory::desc ad({m, k}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc bd({k, n}, memory::data_type::f32, memory::format_tag::ba);  // B^T stored: dY = dZ wo^T
  const memory::desc cd({m, n}, memory::data_type::f32, memory::format_tag::ab);
  auto a = filled(m * k, 89, 1e-3f), w = filled(n * k, 83, 2e-3f), g = filled(m * n, 7, 0.1f);
  std::vector<float> c(static_cast<size_t>(m * n)), fused_c(c.size()), apart(c.size());
  post_ops po;
  po.append_binary(algorithm::binary_mul, cd);
  primitive_attr attr;
  attr.set_post_ops(po);
  matmul plain(matmul::primitive_desc(matmul::desc(ad, bd, cd), eng));
  matmul fused(matmul::primitive_desc(matmul::desc(ad, bd, cd), attr, eng));
  memory am(ad, eng, a.data()), wm(bd, eng, w.data()), gm(cd, eng, g.data()), cm(cd, eng, c.data()),
      fm(cd, eng, fused_c.data());
  auto separate = [&] {
    sgemm(true, m, n, k, a.data(), w.data(), apart.data());
    for (size_t i = 0; i < apart.size(); ++i) apart[i] *= g[i];
  };
  const auto t = interleaved(
      reps, {[&] { sgemm(true, m, n, k, a.data(), w.data(), c.data()); },
             [&] {
               plain.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
               st.wait();
             },
             separate,
             [&] {
               fused.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, fm},
                                  {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, gm}});
               st.wait();
             }});
  separate();
  const bool same = std::equal(apart.begin(), apart.end(), fused_c.begin());
  std::printf("{\"case\": \"oneDNN matmul primitive\", \"dnnl_sgemm_ms\": %.3f, \"matmul_ms\": %.3f, "
              "\"sgemm_then_multiply_ms\": %.3f, \"matmul_binary_mul_post_op_ms\": %.3f, \"same_bits\": %s}\n",
              t[0], t[1], t[2], t[3], same ? "true" : "false");
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 40;
  if (reps < 1) {
    std::fprintf(stderr, "usage: bench_epilogue [REPS]   (REPS a positive whole number)\n");
    return 2;
  }
  omp_set_num_threads(1);  // one core's half, as each of the pool's threads runs its piece
  kernels(reps);
  row_blocks(reps);
  matmul_primitive(reps);
}
