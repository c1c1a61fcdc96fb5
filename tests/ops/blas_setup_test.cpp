// OpenBLAS's defaults tessel corrects: a CPU that OpenBLAS does not know (it falls back to the
// kernels of CPUs without AVX) gets the family its features call for, idle threads sleep at once,
// and the products stay right.
#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/ops/detail/blas_setup.h"
#include "tessel/ops/detail/local.h"

namespace tessel {
namespace {

using ops::detail::better_blas_kernels;
using ops::detail::CpuFeatures;

using Names = std::vector<std::string>;

TEST(BlasSetup, OnlyAFallBackWithoutAvxIsReplacedByTheFeaturesBestFamily) {
  const CpuFeatures all{.avx = true, .avx2_fma = true, .avx512 = true, .avx512_bf16 = true};
  const CpuFeatures avx512{.avx = true, .avx2_fma = true, .avx512 = true};
  const CpuFeatures avx2{.avx = true, .avx2_fma = true};
  EXPECT_EQ(better_blas_kernels("Prescott", all), (Names{"Cooperlake", "SkylakeX", "Haswell", "Sandybridge"}));
  EXPECT_EQ(better_blas_kernels("prescott", avx512), (Names{"SkylakeX", "Haswell", "Sandybridge"}));
  EXPECT_EQ(better_blas_kernels("Core2", avx2), (Names{"Haswell", "Sandybridge"}));
  EXPECT_EQ(better_blas_kernels("Unknown", avx2), (Names{"Haswell", "Sandybridge"}));
  EXPECT_EQ(better_blas_kernels("Nehalem", CpuFeatures{}), Names{});
  // Families that use the vector units, and names this list does not know, stay.
  for (const char* kept : {"Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Prescot"})
    EXPECT_EQ(better_blas_kernels(kept, all), Names{}) << kept;
}

// The largest error of an m x n x k f64 product (OpenBLAS's: tessel's f32 products of this size
// run oneDNN's) against a long double sum, relative to the sum of the terms' sizes: as the ops
// multiply (blas_threads 0), or on that many of OpenBLAS's own threads.
double product_error(int64_t m, int64_t n, int64_t k, int blas_threads = 0) {
  std::mt19937 rng(7);
  std::normal_distribution<double> dist;
  std::vector<double> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
  for (double& x : a) x = dist(rng);
  for (double& x : b) x = dist(rng);
  const auto* pa = reinterpret_cast<const std::byte*>(a.data());
  const auto* pb = reinterpret_cast<const std::byte*>(b.data());
  auto* pc = reinterpret_cast<std::byte*>(c.data());
  if (blas_threads == 0) {
    ops::detail::gemm(DType::kF64, false, false, m, n, k, pa, pb, pc, false);
  } else {
    ops::detail::set_blas_threads(blas_threads);
    ops::detail::gemm_strided(DType::kF64, false, false, m, n, k, pa, k, pb, n, pc, n, false);
    ops::detail::set_blas_threads(1);
  }
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      long double want = 0, scale = 1;
      for (int64_t p = 0; p < k; ++p) {
        want += static_cast<long double>(a[i * k + p]) * b[p * n + j];
        scale += std::abs(static_cast<long double>(a[i * k + p]) * b[p * n + j]);
      }
      worst = std::max(worst, static_cast<double>(std::abs(c[i * n + j] - want) / scale));
    }
  return worst;
}

TEST(BlasSetup, AMisdetectedCpuGetsVectorKernelsAndTheSameProducts) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE chooses the kernels";
  const CpuFeatures cpu = CpuFeatures::of_this_cpu();
  if (!cpu.avx2_fma) GTEST_SKIP() << "no AVX2: nothing better than OpenBLAS's choice";
  // Whatever OpenBLAS picked on this machine, tessel's first product runs vector kernels.
  const std::string first = ops::detail::blas_core();
  EXPECT_TRUE(better_blas_kernels(first, cpu).empty()) << first;
  // A CPU OpenBLAS does not know, as on a model newer than the library.
  if (!ops::detail::switch_blas_kernels("Prescott")) GTEST_SKIP() << "OpenBLAS here cannot switch kernels";
  EXPECT_STREQ(ops::detail::blas_core(), "Prescott");
  const float before = product_error(67, 45, 300);
  const std::string chosen = ops::detail::select_blas_kernels();
  EXPECT_TRUE(better_blas_kernels(chosen, cpu).empty()) << chosen;
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);  // the process's environment as it was
  EXPECT_LT(before, 1e-13);
  EXPECT_LT(product_error(67, 45, 300), 1e-13);
  EXPECT_TRUE(ops::detail::switch_blas_kernels(first));
}

TEST(BlasSetup, IdleThreadsSleepAtOnceUnlessTheUserChoseAWait) {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) GTEST_SKIP() << "OPENBLAS_THREAD_TIMEOUT chooses the wait";
  if (openblas_get_parallel() != 1) GTEST_SKIP() << "this OpenBLAS has no threads of its own";
  EXPECT_LT(product_error(67, 45, 300), 1e-13);  // tessel's first product sets OpenBLAS up
  EXPECT_EQ(ops::detail::blas_thread_timeout(), ops::detail::kBlasThreadTimeout);
  EXPECT_EQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), nullptr);  // the process's environment as it was
  EXPECT_LT(product_error(256, 320, 288, 2), 1e-13);
  // Restarted with another wait, the threads still multiply, again and again.
  ASSERT_TRUE(ops::detail::set_blas_thread_timeout(12));
  EXPECT_EQ(ops::detail::blas_thread_timeout(), 12);
  for (int i = 0; i < 3; ++i) EXPECT_LT(product_error(256, 320, 288, 2), 1e-13);
  ASSERT_TRUE(ops::detail::set_blas_thread_timeout(ops::detail::kBlasThreadTimeout));
  EXPECT_LT(product_error(256, 320, 288, 2), 1e-13);
  EXPECT_EQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), nullptr);
}

}  // namespace
}  // namespace tessel
