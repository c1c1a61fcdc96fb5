// The product of many devices' rows with one packed B (ops/detail/packed_gemm.h): values against
// a double reference on edge shapes, the same bits however rows are grouped or the work is
// split, and dot/dot_nt of a replicated f32 weight bit-identical on any data-parallel split.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "ops/ops_test_util.h"
#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/packed_gemm.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/runtime.h"

namespace tessel {
namespace {

using testing::random_floats;
using ops::detail::packed_gemm;
using ops::detail::packed_gemm_sum;
using ops::detail::RowBlock;
using ops::detail::SumTerm;

Tensor put_on(const Runtime& rt, const Mesh& mesh, const std::vector<float>& v, const Shape& shape, const PartitionSpec& spec) {
  return Tensor(device_put(rt, HostArray::from<float>(shape, std::span<const float>(v)), NamedSharding(mesh, spec)));
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
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(3);
  // Rows around the tiles (6 and 14 rows), columns around the panels (16 and 32), depths around
  // the 256 k block.
  for (int64_t m : {1, 6, 7, 14, 15, 64}) {
    for (int64_t n : {1, 16, 17, 32, 33, 100}) {
      for (int64_t k : {0, 1, 255, 256, 257, 600}) {
        for (int trans = 0; trans < 4; ++trans) {
          const bool trans_a = trans & 1, trans_b = trans & 2;
          SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " trans_a " << trans_a
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

// The documented bits, element by element: each k block of 256 a fused multiply-add chain from
// zero, the blocks added in order. The AVX-512 and AVX2 kernels (other tiles, other packings)
// both give them, so a product's bits do not depend on the machine's vector width either.
TEST(PackedGemm, EveryInstructionSetGivesTheBitsOfOneChainPerKBlock) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(11);
  const int64_t kc = ops::detail::packed_gemm_sum_max_k();
  for (int64_t m : {1, 6, 7, 14, 15, 40}) {
    for (int64_t n : {1, 16, 17, 32, 33, 70}) {
      for (int64_t k : {1, 256, 257, 600}) {
        const std::vector<float> a = random_floats(rng, m * k), b = random_floats(rng, k * n);
        for (int trans = 0; trans < 4; ++trans) {
          const bool trans_a = trans & 1, trans_b = trans & 2;
          std::vector<float> want(static_cast<size_t>(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              float sum = 0;
              for (int64_t p0 = 0; p0 < k; p0 += kc) {
                float chain = 0;
                for (int64_t p = p0; p < std::min(k, p0 + kc); ++p)
                  chain = std::fma(trans_a ? a[p * m + i] : a[i * k + p], trans_b ? b[j * k + p] : b[p * n + j], chain);
                sum = p0 == 0 ? chain : sum + chain;
              }
              want[i * n + j] = sum;
            }
          for (bool avx2 : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " trans_a " << trans_a
                                            << " trans_b " << trans_b << " AVX2 preferred " << avx2);
            ops::detail::packed_gemm_prefer_avx2(avx2);
            std::vector<float> c(want.size(), std::nanf(""));
            packed_gemm(trans_a, trans_b, k, n, b.data(), {{m, a.data(), c.data()}});
            ops::detail::packed_gemm_prefer_avx2(false);
            ASSERT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0);
          }
        }
        // The sum of two devices' weight gradients: each term's chain, the second added.
        const int64_t rows = std::min<int64_t>(k, kc);
        const std::vector<float> a2 = random_floats(rng, rows * m), b2 = random_floats(rng, rows * n);
        std::vector<float> want(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            float first = 0, second = 0;
            for (int64_t p = 0; p < rows; ++p) first = std::fma(a[p * m + i], b[p * n + j], first);
            for (int64_t p = 0; p < rows; ++p) second = std::fma(a2[p * m + i], b2[p * n + j], second);
            want[i * n + j] = first + second;
          }
        for (bool avx2 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "sum: m " << m << " n " << n << " k " << rows << " AVX2 preferred " << avx2);
          ops::detail::packed_gemm_prefer_avx2(avx2);
          std::vector<float> c(want.size(), std::nanf(""));
          packed_gemm_sum(m, n, {{rows, a.data(), b.data()}, {rows, a2.data(), b2.data()}}, c.data());
          ops::detail::packed_gemm_prefer_avx2(false);
          ASSERT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(PackedGemm, RowsGetTheSameBitsHoweverTheyAreGroupedOrSplit) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
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
  ops::detail::run_spread(rt, [&] {
    std::vector<RowBlock> rows;
    for (int64_t i = 0; i < m; ++i) rows.push_back({1, a.data() + i * k, spread.data() + i * n});
    packed_gemm(false, true, k, n, b.data(), rows);
  });
  EXPECT_EQ(std::memcmp(whole.data(), spread.data(), whole.size() * sizeof(float)), 0);
}

// B read in place from a grid of pieces (a weight's shards): the bits of B dense, whatever the cuts
// (inside a 32-column panel, a 16 x 16 transposed block or a k block; pieces without rows).
TEST(PackedGemm, BInPiecesGivesTheBitsOfBDense) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(8);
  const int64_t m = 40, n = 150, k = 530;
  const std::vector<float> a = random_floats(rng, m * k);
  for (bool trans_b : {false, true}) {
    const int64_t rows = trans_b ? n : k, cols = trans_b ? k : n;  // B as stored
    const std::vector<float> b = random_floats(rng, rows * cols);
    std::vector<float> dense(static_cast<size_t>(m * n));
    packed_gemm(false, trans_b, k, n, b.data(), {{m, a.data(), dense.data()}});
    for (auto [row_cuts, col_cuts] : {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0}, {0}},
                                      {{0, 128, 256, 384}, {0}},
                                      {{0}, {0, 37, 64, 100}},
                                      {{0, 7, 7, 100, 263}, {0, 16, 17, 90, 149}}}) {
      SCOPED_TRACE(::testing::Message() << "trans_b " << trans_b << ", " << row_cuts.size() << " x " << col_cuts.size()
                                      << " pieces");
      // The cuts that fall inside this B as stored (its rows are n when transposed).
      ops::detail::Pieces pieces{{}, {}, {}};
      for (int64_t cut : row_cuts)
        if (cut < rows) pieces.row_at.push_back(cut);
      for (int64_t cut : col_cuts)
        if (cut < cols) pieces.col_at.push_back(cut);
      pieces.row_at.push_back(rows);
      pieces.col_at.push_back(cols);
      // Each piece copied out on its own (its own width), with the rest of the matrix unreadable.
      std::vector<std::vector<float>> stored;
      for (size_t i = 0; i + 1 < pieces.row_at.size(); ++i) {
        for (size_t j = 0; j + 1 < pieces.col_at.size(); ++j) {
          std::vector<float> piece;
          for (int64_t r = pieces.row_at[i]; r < pieces.row_at[i + 1]; ++r)
            piece.insert(piece.end(), b.begin() + r * cols + pieces.col_at[j], b.begin() + r * cols + pieces.col_at[j + 1]);
          stored.push_back(std::move(piece));
        }
      }
      for (const auto& piece : stored) pieces.data.push_back(piece.data());
      std::vector<float> out(dense.size(), std::nanf(""));
      packed_gemm(false, trans_b, k, n, pieces, {{m, a.data(), out.data()}});
      EXPECT_EQ(std::memcmp(dense.data(), out.data(), dense.size() * sizeof(float)), 0);
    }
  }
  // Pieces that do not make the product's B are refused.
  std::vector<float> out(static_cast<size_t>(m * n));
  EXPECT_THROW(packed_gemm(false, false, k, n, ops::detail::Pieces::dense(k - 1, n, a.data()), {{m, a.data(), out.data()}}),
               Error);
}

// dot and dot_nt of a weight sharded over the devices that share it (FSDP in one process), read in
// place: the bits of the same weight gathered first, and the devices charged the bytes a gather
// would have brought them.
TEST(PackedGemm, ShardedWeightProductsHaveTheBitsOfTheGatheredWeight) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(9);
  Runtime rt = Runtime::host(8);
  const int64_t rows = 96, k = 260, n = 70;
  const std::vector<float> x = random_floats(rng, rows * k), w = random_floats(rng, k * n), wt = random_floats(rng, n * k);
  const Mesh mesh = Mesh::parse("data=2,fsdp=4");
  auto put = [&](const std::vector<float>& v, Shape shape, const PartitionSpec& spec) { return put_on(rt, mesh, v, shape, spec); };
  const Tensor tx = put(x, Shape({rows, k}), PartitionSpec{{"data", "fsdp"}, {}});
  auto products = [&](const PartitionSpec& w_spec, const PartitionSpec& wt_spec) {
    const Tensor tw = put(w, Shape({k, n}), w_spec), twt = put(wt, Shape({n, k}), wt_spec);
    std::vector<float> out;
    for (const Tensor& t : {ops::dot(tx, tw), ops::dot_nt(tx, twt)}) {
      const HostArray h = to_host(t.array());
      const auto v = h.values<float>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  auto received = [&] {
    int64_t bytes = 0;
    for (int64_t d = 0; d < 8; ++d) bytes += rt.device(d).memory_stats().bytes_received;
    return bytes;
  };
  const std::vector<float> gathered = products({}, {});
  const int64_t before = received();
  rt.device(0).reset_peak();
  const int64_t held = rt.device(0).memory_stats().in_use;
  // Rows of w split 4 ways, columns of w^T likewise; the other way round too.
  const std::vector<float> by_k = products({{"fsdp"}, {}}, {{}, {"fsdp"}});
  // Each device lacks 3/4 of both weights: 3/4 of (k x n) floats twice, on 8 devices.
  EXPECT_EQ(received() - before, 8 * 2 * (k * n - k * n / 4) * int64_t{sizeof(float)});
  // Yet no device held a gathered weight beside its shards (the shards, the products' blocks and
  // the batch's: 52 KiB here, a weight 71 KiB).
  EXPECT_LT(rt.device(0).memory_stats().peak - held, k * n * int64_t{sizeof(float)});
  const std::vector<float> by_n = products({{}, {"fsdp"}}, {{"fsdp"}, {}});
  EXPECT_EQ(std::memcmp(gathered.data(), by_k.data(), gathered.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(gathered.data(), by_n.data(), gathered.size() * sizeof(float)), 0);
}

// dot and dot_nt of batch-split f32 rows with a replicated weight: the rows of any split get the
// same bits (one process of 8 devices must match 2 processes of 4), close to one device's; the
// weight gradient (dot_tn, a partial sum per device) close to one device's.
TEST(PackedGemm, ReplicatedWeightProductsAreBitIdenticalOnAnyDataSplit) {
  // Without AVX-512 the products stay with OpenBLAS, whose rows may depend on their grouping.
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(5);
  Runtime rt = Runtime::host(8);
  const int64_t rows = 96, k = 260, n = 70;
  const std::vector<float> x = random_floats(rng, rows * k), w = random_floats(rng, k * n), wt = random_floats(rng, n * k);
  auto run = [&](const char* mesh_text) {
    const Mesh mesh = Mesh::parse(mesh_text);
    const PartitionSpec data{{"data"}, {}};
    auto put = [&](const std::vector<float>& v, Shape shape, const PartitionSpec& spec) { return put_on(rt, mesh, v, shape, spec); };
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

// What packed_gemm_sum stands for: each term's own packed_gemm product, summed in order as the
// runtime's f32 reduction adds devices' partial sums (first stored, each next added).
std::vector<float> sum_of_products(int64_t m, int64_t n, const std::vector<SumTerm>& terms) {
  std::vector<float> sum(static_cast<size_t>(m * n)), one(sum.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    packed_gemm(true, false, terms[t].k, n, terms[t].b, {{m, terms[t].a, one.data()}});
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = t == 0 ? one[i] : sum[i] + one[i];
  }
  return sum;
}

TEST(PackedGemmSum, HasTheBitsOfEachTermsProductSummedInOrder) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(6);
  Runtime rt = Runtime::host(2);
  // Rows around the 14-row tile, columns around the 32-column panel and the 8-panel group, terms
  // of unequal depth up to the one k block (an empty one included).
  for (int64_t m : {1, 14, 15, 45}) {
    for (int64_t n : {1, 33, 256, 300}) {
      for (const std::vector<int64_t>& ks : std::vector<std::vector<int64_t>>{{5}, {64, 64, 64}, {3, 0, 256, 17}, {0}}) {
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " terms " << ks.size() << " first k " << ks[0]);
        std::vector<std::vector<float>> a, b;
        std::vector<SumTerm> terms;
        for (int64_t k : ks) {
          a.push_back(random_floats(rng, k * m));
          b.push_back(random_floats(rng, k * n));
          terms.push_back({k, a.back().data(), b.back().data()});
        }
        const std::vector<float> want = sum_of_products(m, n, terms);
        std::vector<float> got(want.size(), std::nanf(""));
        packed_gemm_sum(m, n, terms, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
        // Spread over the cores (inside an op's spread region): the same bits.
        std::vector<float> spread(want.size(), std::nanf(""));
        ops::detail::run_spread(rt, [&] { packed_gemm_sum(m, n, terms, spread.data()); });
        EXPECT_EQ(std::memcmp(spread.data(), want.data(), spread.size() * sizeof(float)), 0);
      }
    }
  }
  // Against a double reference: the terms' rows together form one product.
  const int64_t m = 30, n = 70;
  std::vector<float> a = random_floats(rng, 200 * m), b = random_floats(rng, 200 * n);
  const std::vector<SumTerm> terms{{120, a.data(), b.data()}, {80, a.data() + 120 * m, b.data() + 120 * n}};
  std::vector<float> c(static_cast<size_t>(m * n));
  packed_gemm_sum(m, n, terms, c.data());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, scale = 0;
      for (int64_t p = 0; p < 200; ++p) {
        want += double(a[p * m + i]) * b[p * n + j];
        scale += std::abs(double(a[p * m + i]) * b[p * n + j]);
      }
      ASSERT_NEAR(c[i * n + j], want, 1e-6 * (scale + 1)) << "row " << i << " column " << j;
    }
  }
}

TEST(PackedGemmSum, RefusesATermBeyondOneKBlock) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  const int64_t k = ops::detail::packed_gemm_sum_max_k() + 1;
  std::vector<float> a(static_cast<size_t>(k * 4)), b(static_cast<size_t>(k * 4)), c(16);
  EXPECT_THROW(packed_gemm_sum(4, 4, {{k, a.data(), b.data()}}, c.data()), ValueError);
}

// dot_tn of few rows per device contracted over the devices (a weight gradient under data or FSDP
// parallelism): reduced in the product, with the bits of every device's product (packed_gemm) added
// in group order, the order in which the runtime's reduction (the only way across processes) adds
// them. Rows split unevenly over the devices, one and two contracted axes, 2-D and 3-D operands.
TEST(PackedGemmSum, WeightGradientsOfDeviceRowsAreSummedInGroupOrder) {
  if (!ops::detail::packed_gemm_supported()) GTEST_SKIP() << "needs AVX-512F or AVX2 with FMA";
  std::mt19937 rng(7);
  Runtime rt = Runtime::host(8);
  struct Case {
    const char* mesh;
    PartitionSpec lead;  // of the rows
    std::vector<std::string> contracted;
  };
  for (const Case& c : {Case{"data=8", {{"data"}}, {"data"}}, Case{"data=2,fsdp=4", {{"data", "fsdp"}}, {"data", "fsdp"}},
                        Case{"fsdp=4,tensor=2", {{"fsdp"}}, {"fsdp"}}}) {
    for (bool three_d : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.mesh << (three_d ? " 3-D" : " 2-D"));
      const Mesh mesh = Mesh::parse(c.mesh);
      const int64_t rows = 90, k = 37, n = 41;  // 90 rows: 12 and 11 per device on 8
      const std::vector<float> x = random_floats(rng, rows * k), g = random_floats(rng, rows * n);
      const Shape xs = three_d ? Shape({3, rows / 3, k}) : Shape({rows, k}), gs = three_d ? Shape({3, rows / 3, n}) : Shape({rows, n});
      PartitionSpec spec = c.lead;
      if (three_d) spec = PartitionSpec{c.lead.dims()[0], {}, {}};
      const Tensor tx(device_put(rt, HostArray::from<float>(xs, std::span<const float>(x)), NamedSharding(mesh, spec)));
      const Tensor tg(device_put(rt, HostArray::from<float>(gs, std::span<const float>(g)), NamedSharding(mesh, spec)));
      const Tensor w = ops::dot_tn(tx, tg);
      EXPECT_FALSE(w.is_partial());
      // The expected bits: each device's rows multiplied alone, then added in group order.
      const auto groups = mesh.subgroups(c.contracted);
      for (int64_t d : mesh.device_ids()) {
        const auto& group = *std::find_if(groups.begin(), groups.end(), [&](const auto& members) {
          return std::find(members.begin(), members.end(), d) != members.end();
        });
        std::vector<SumTerm> terms;
        for (int64_t member : group) {
          const Box& box = tx.shards().shard(member).box;
          const int64_t r = box.volume() / k;
          terms.push_back({r, tx.shards().shard(member).buffer.as<float>().data(), tg.shards().shard(member).buffer.as<float>().data()});
        }
        const Box& out = w.shards().shard(d).box;
        ASSERT_EQ(out.volume(), k * n) << "device " << d;
        const std::vector<float> want = sum_of_products(k, n, terms);
        EXPECT_EQ(std::memcmp(w.shards().shard(d).buffer.data(), want.data(), want.size() * sizeof(float)), 0) << "device " << d;
      }
      // Abstract evaluation agrees on the result's sharding.
      const Tensor abstract = ops::dot_tn(Tensor::abstract(xs, DType::kF32, NamedSharding(mesh, spec)),
                                          Tensor::abstract(gs, DType::kF32, NamedSharding(mesh, spec)));
      EXPECT_FALSE(abstract.is_partial());
      EXPECT_EQ(abstract.sharding(), w.sharding());
    }
  }
}

}  // namespace
}  // namespace tessel
