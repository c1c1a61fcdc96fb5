// The attention's small products (ops/detail/small_gemm.h): on random shapes, strides and both
// orientations of A, every element has the bits of one fused multiply-add chain over k from zero
// (then added to C when accumulating), and the transpose moves every element; refused where the
// CPU has no AVX-512F.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ops/ops_test_util.h"
#include "tessel/core/error.h"
#include "tessel/ops/detail/small_gemm.h"

namespace tessel {
namespace {

using namespace ops::detail;  // small_gemm, small_gemm_supported, transpose_block
using testing::random_floats;

TEST(SmallGemm, EveryElementIsOneFusedChainOverK) {
  if (!small_gemm_supported()) {
    float x = 0;
    EXPECT_THROW(small_gemm(1, 1, 1, &x, 1, 1, &x, 1, &x, 1, false), Error);
    GTEST_SKIP() << "this CPU has no AVX-512F";
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> rows(1, 40), cols(1, 300), depth(0, 70), pad(0, 5);
  for (int iter = 0; iter < 200; ++iter) {
    const int64_t m = rows(rng), n = iter % 4 == 0 ? 16 * (1 + iter % 9) : cols(rng), k = depth(rng);
    const bool trans_a = iter % 2 == 1, accumulate = iter % 3 == 0;
    const int64_t lda = (trans_a ? m : k) + pad(rng), ldb = n + pad(rng), ldc = n + pad(rng);
    SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " trans_a " << trans_a << " accumulate "
                                      << accumulate);
    const std::vector<float> a = random_floats(rng, (trans_a ? k : m) * lda + 1),
                             b = random_floats(rng, k * ldb + 1);
    std::vector<float> c = random_floats(rng, m * ldc);
    std::vector<float> want = c;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        float chain = 0;
        for (int64_t p = 0; p < k; ++p) chain = std::fma(a[trans_a ? p * lda + r : r * lda + p], b[p * ldb + j], chain);
        float& w = want[r * ldc + j];
        w = accumulate ? w + chain : chain;
      }
    }
    small_gemm(m, n, k, a.data(), trans_a ? 1 : lda, trans_a ? lda : 1, b.data(), ldb, c.data(), ldc, accumulate);
    // Padding between rows stays as it was: compared too.
    ASSERT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0);
  }
}

TEST(SmallGemm, TransposeMovesEveryElement) {
  if (!small_gemm_supported()) GTEST_SKIP() << "this CPU has no AVX-512F";
  std::mt19937 rng(8);
  std::uniform_int_distribution<int64_t> extent(1, 70), pad(0, 9);
  for (int iter = 0; iter < 50; ++iter) {
    const int64_t rows = extent(rng), cols = extent(rng), ld_x = cols + pad(rng), ld_out = rows + pad(rng);
    const std::vector<float> x = random_floats(rng, rows * ld_x);
    std::vector<float> out(static_cast<size_t>(cols * ld_out), -1.0f), want = out;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) want[j * ld_out + i] = x[i * ld_x + j];
    transpose_block(rows, cols, x.data(), ld_x, out.data(), ld_out);
    ASSERT_EQ(out, want) << rows << " x " << cols;
  }
}

}  // namespace
}  // namespace tessel
