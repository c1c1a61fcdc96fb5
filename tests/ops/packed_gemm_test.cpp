// The product of many devices' rows with one packed B (ops/detail/packed_gemm.h): values against
// a double reference on edge shapes, the same bits however rows are grouped or the work is
// split, and dot/dot_nt of a replicated f32 weight bit-identical on any data-parallel split.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/packed_gemm.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

using ops::detail::packed_gemm;
using ops::detail::RowBlock;

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// For each output of dot(x, w), dot_nt(x, wt) and dot_tn(x, dot(x, w)), in that order: the sum of
// the magnitudes of its terms (for dot_tn with the magnitudes of dot(x, w)'s sums), which bounds
// the rounding of any summation order.
std::vector<double> magnitudes(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& wt,
                               int64_t rows, int64_t k, int64_t n) {
  std::vector<double> y(static_cast<size_t>(rows * n)), out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += std::abs(double(x[r * k + p]) * w[p * n + j]);
      y[r * n + j] = s;
    }
  out.insert(out.end(), y.begin(), y.end());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += std::abs(double(x[r * k + p]) * wt[j * k + p]);
      out.push_back(s);
    }
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t r = 0; r < rows; ++r) s += std::abs(double(x[r * k + p])) * y[r * n + j];
      out.push_back(s);
    }
  return out;
}

TEST(PackedGemm, MatchesADoubleReferenceOnEdgeShapes) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F";
  std::mt19937 rng(3);
  // Rows around the 14-row tile, columns around the 32-column panel, depths around the 192 block.
  for (int64_t m : {1, 13, 14, 15, 64}) {
    for (int64_t n : {1, 31, 32, 33, 100}) {
      for (int64_t k : {0, 1, 191, 192, 193, 500}) {
        for (int trans = 0; trans < 4; ++trans) {
          const bool trans_a = trans & 1, trans_b = trans & 2;
          SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k << " trans_a " << trans_a
                                          << " trans_b " << trans_b);
          const std::vector<float> a = random_floats(rng, m * k), b = random_floats(rng, k * n);
          std::vector<float> c(static_cast<size_t>(m * n), std::nanf(""));
          packed_gemm(trans_a, trans_b, k, n, b.data(), {{m, a.data(), c.data()}});
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double want = 0, scale = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double x = double(trans_a ? a[p * m + i] : a[i * k + p]) * (trans_b ? b[j * k + p] : b[p * n + j]);
                want += x;
                scale += std::abs(x);
              }
              ASSERT_NEAR(c[i * n + j], want, 1e-6 * (scale + 1)) << "row " << i << " column " << j;
            }
          }
        }
      }
    }
  }
}

TEST(PackedGemm, RowsGetTheSameBitsHoweverTheyAreGroupedOrSplit) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F";
  std::mt19937 rng(4);
  const int64_t m = 100, n = 300, k = 450;
  const std::vector<float> a = random_floats(rng, m * k), b = random_floats(rng, n * k);
  std::vector<float> whole(static_cast<size_t>(m * n));
  packed_gemm(false, true, k, n, b.data(), {{m, a.data(), whole.data()}});
  // The same rows in blocks of other sizes, one call.
  std::vector<float> pieces(whole.size());
  std::vector<RowBlock> blocks;
  for (int64_t lo = 0, size = 1; lo < m; lo += size, size = size * 3 % 17 + 1) {
    const int64_t rows = std::min(size, m - lo);
    blocks.push_back({rows, a.data() + lo * k, pieces.data() + lo * n});
  }
  ASSERT_GT(blocks.size(), 5u);
  packed_gemm(false, true, k, n, b.data(), blocks);
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.size() * sizeof(float)), 0);
  // And split over the cores (inside an op's spread region), one block per row.
  Runtime rt = Runtime::host(1);
  std::vector<float> spread(whole.size());
  ops::detail::compute_blocks_together(rt, Shape({1}), DType::kF32, NamedSharding(Mesh::parse("x=1"), PartitionSpec{}),
                                       true, [&](const std::vector<ops::detail::BlockTask>&) {
                                         std::vector<RowBlock> rows;
                                         for (int64_t i = 0; i < m; ++i) rows.push_back({1, a.data() + i * k, spread.data() + i * n});
                                         packed_gemm(false, true, k, n, b.data(), rows);
                                       });
  EXPECT_EQ(std::memcmp(whole.data(), spread.data(), whole.size() * sizeof(float)), 0);
}

// dot and dot_nt of batch-split f32 rows with a replicated weight: the rows of any split get the
// same bits (one process of 8 devices must match 2 processes of 4), close to one device's; the
// weight gradient (dot_tn, a partial sum per device) close to one device's.
TEST(PackedGemm, ReplicatedWeightProductsAreBitIdenticalOnAnyDataSplit) {
  // Without AVX-512 the products stay with OpenBLAS, whose rows may depend on their grouping.
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F";
  std::mt19937 rng(5);
  Runtime rt = Runtime::host(8);
  const int64_t rows = 96, k = 260, n = 70;
  const std::vector<float> x = random_floats(rng, rows * k), w = random_floats(rng, k * n), wt = random_floats(rng, n * k);
  auto run = [&](const char* mesh_text) {
    const Mesh mesh = Mesh::parse(mesh_text);
    const PartitionSpec data{{"data"}, {}};
    auto put = [&](const std::vector<float>& v, Shape shape, const PartitionSpec& spec) {
      return Tensor(device_put(rt, HostArray::from<float>(shape, std::span<const float>(v)), NamedSharding(mesh, spec)));
    };
    const Tensor tx = put(x, Shape({rows, k}), mesh.device_count() > 1 ? data : PartitionSpec{});
    const Tensor tw = put(w, Shape({k, n}), PartitionSpec{}), twt = put(wt, Shape({n, k}), PartitionSpec{});
    std::vector<float> out;
    for (const Tensor& t : {ops::dot(tx, tw), ops::dot_nt(tx, twt), ops::reduce(ops::dot_tn(tx, ops::dot(tx, tw)))}) {
      const HostArray h = to_host(t.array());
      const auto v = h.values<float>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  const std::vector<float> one = run("data=1"), two = run("data=2"), four = run("data=4"), eight = run("data=8");
  // The products (the first 2 rows x n each); dot_tn's sums over the rows differ in order.
  const size_t products = 2 * rows * n * sizeof(float);
  EXPECT_EQ(std::memcmp(two.data(), eight.data(), products), 0);
  EXPECT_EQ(std::memcmp(four.data(), eight.data(), products), 0);
  // Against one device (OpenBLAS, whose summation order depends on the CPU's kernels): rounding
  // is bounded by the sum of the terms' magnitudes, not by the result, which cancels.
  const std::vector<double> scale = magnitudes(x, w, wt, rows, k, n);
  for (size_t i = 0; i < one.size(); ++i)
    ASSERT_NEAR(eight[i], one[i], 2e-5 * (1 + scale[i])) << "element " << i << " of magnitude " << scale[i];
}

}  // namespace
}  // namespace tessel
