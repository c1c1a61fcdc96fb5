// The per-device f32 products (ops/detail/local.h): oneDNN's sgemm for all but the smallest,
// OpenBLAS's below kSgemmDnnlMinWork. A product has the same bits whether the pool spreads it over
// 2, 3 or 4 cores or one core runs it (a 1-device op spreads its products; a device of a larger
// mesh runs its own on one core), and wherever its operands lie.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/ops/detail/blas_setup.h"
#include "tessel/ops/detail/local.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"
#include "tessel/sharding/mesh.h"

namespace tessel {
namespace {

using ops::detail::gemm;
using ops::detail::gemm_strided;

struct Product {
  int64_t m, n, k;
  bool trans_a, trans_b, accumulate;
};

std::vector<float> random_floats(std::mt19937& rng, int64_t count) {
  std::normal_distribution<float> dist;
  std::vector<float> out(static_cast<size_t>(count));
  for (float& x : out) x = dist(rng);
  return out;
}

const std::byte* bytes(const float* p) { return reinterpret_cast<const std::byte*>(p); }
std::byte* bytes(float* p) { return reinterpret_cast<std::byte*>(p); }

TEST(Gemm, F32ProductsHaveTheSameBitsOnAnyNumberOfCoresAndWhereverTheyLie) {
  std::mt19937 rng(5);
  std::vector<Runtime> pools;  // 2, 3 and 4 worker threads to spread over
  for (int threads : {2, 3, 4}) pools.push_back(Runtime::host(RuntimeOptions{.devices = 1, .threads = threads}));
  // [1200, 1000] x [1000, 1000]: oneDNN runs its copy-based kernel on the whole and its no-copy
  // kernel on halves of its rows, whose bits differ: what product_pieces guards against.
  std::vector<Product> products = {{512, 1024, 768, false, false, false},  {300, 700, 129, false, true, true},
                                   {1000, 64, 300, true, false, false},   {40, 40, 40, false, false, false},
                                   {64, 33, 31, true, true, true},       {130, 900, 1000, true, true, false},
                                   {1200, 1000, 1000, false, false, false}, {1200, 1000, 1000, false, true, false},
                                   {200, 1024, 1024, false, false, true}};
  std::uniform_int_distribution<int64_t> side(1, 600);
  for (int i = 0; i < 6; ++i)
    products.push_back({side(rng), side(rng), side(rng), rng() % 2 == 0, rng() % 2 == 0, rng() % 2 == 0});
  for (const Product& p : products) {
    SCOPED_TRACE(testing::Message() << p.m << " x " << p.n << " x " << p.k << " trans " << p.trans_a << p.trans_b
                                    << " accumulate " << p.accumulate);
    const std::vector<float> a = random_floats(rng, p.m * p.k), b = random_floats(rng, p.k * p.n),
                             c0 = random_floats(rng, p.m * p.n);
    // On this thread alone, as a device of a larger mesh runs its block (run_blocks keeps
    // OpenBLAS to one thread: on its own threads it blocks k differently, hence other bits).
    ops::detail::set_blas_threads(1);
    std::vector<float> alone = c0;
    gemm(DType::kF32, p.trans_a, p.trans_b, p.m, p.n, p.k, bytes(a.data()), bytes(b.data()), bytes(alone.data()),
         p.accumulate);
    // Against f64: every element within the rounding of its terms (every 16th row of the large
    // products, which the sanitizer build would take minutes over).
    const int64_t row_step = p.m * p.n * p.k > (int64_t{1} << 26) ? 16 : 1;
    for (int64_t r = 0; r < p.m; r += row_step) {
      for (int64_t c = 0; c < p.n; ++c) {
        double want = p.accumulate ? c0[r * p.n + c] : 0.0, scale = std::abs(want);
        for (int64_t q = 0; q < p.k; ++q) {
          const double term = double(a[p.trans_a ? q * p.m + r : r * p.k + q]) * b[p.trans_b ? c * p.k + q : q * p.n + c];
          want += term;
          scale += std::abs(term);
        }
        ASSERT_NEAR(alone[r * p.n + c], want, 1e-6 * (scale + 1)) << "row " << r << " column " << c;
      }
    }
    // Spread over pools of other sizes, as a 1-device op spreads it (a process holding one device
    // of the mesh).
    for (const Runtime& rt : pools) {
      std::vector<float> spread = c0;
      ops::detail::run_spread(rt, [&] {
        gemm(DType::kF32, p.trans_a, p.trans_b, p.m, p.n, p.k, bytes(a.data()), bytes(b.data()), bytes(spread.data()),
             p.accumulate);
      });
      EXPECT_EQ(std::memcmp(spread.data(), alone.data(), alone.size() * sizeof(float)), 0) << rt.pool().size() << " threads";
    }
    // The same values one float past a 64-byte boundary.
    std::vector<float> a1(a.size() + 1), b1(b.size() + 1), c1(c0.size() + 1);
    std::copy(a.begin(), a.end(), a1.begin() + 1);
    std::copy(b.begin(), b.end(), b1.begin() + 1);
    std::copy(c0.begin(), c0.end(), c1.begin() + 1);
    gemm(DType::kF32, p.trans_a, p.trans_b, p.m, p.n, p.k, bytes(a1.data() + 1), bytes(b1.data() + 1), bytes(c1.data() + 1),
         p.accumulate);
    EXPECT_EQ(std::memcmp(c1.data() + 1, alone.data(), alone.size() * sizeof(float)), 0);
  }
}

TEST(Gemm, AnOverwrittenProductIgnoresWhatTheOutputHeld) {
  std::mt19937 rng(6);
  for (int64_t side : {8, 200}) {  // OpenBLAS's side of the threshold, then oneDNN's
    SCOPED_TRACE(side);
    ASSERT_EQ(ops::detail::sgemm_runs_dnnl(side, side, side),
              ops::detail::CpuFeatures::of_this_cpu().avx512 && side * side * side >= ops::detail::kSgemmDnnlMinWork);
    const std::vector<float> a = random_floats(rng, side * side), b = random_floats(rng, side * side);
    std::vector<float> nan(static_cast<size_t>(side * side), std::nanf("")), zero(nan.size(), 0.0f);
    gemm_strided(DType::kF32, false, false, side, side, side, bytes(a.data()), side, bytes(b.data()), side, bytes(nan.data()),
                 side, false);
    gemm_strided(DType::kF32, false, false, side, side, side, bytes(a.data()), side, bytes(b.data()), side, bytes(zero.data()),
                 side, true);
    EXPECT_EQ(std::memcmp(nan.data(), zero.data(), nan.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace tessel
