// Ops across MPI ranks (run by ctest under mpirun at 2 and 4 ranks, 8 devices in all): the same
// bits on each rank's devices as the same ops on 8 devices in one process.
#include <mpi.h>

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "mpi_test_util.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

using testing::mpi;
using testing::reference;

void expect_same_blocks(const Tensor& got, const Tensor& want) {
  ASSERT_FALSE(got.is_partial());
  ASSERT_FALSE(want.is_partial());
  ASSERT_EQ(got.sharding(), want.sharding());
  for (int64_t d : got.sharding().mesh().device_ids()) {
    if (!got.shards().runtime().is_addressable(d)) continue;
    const auto a = got.shards().shard(d).buffer.bytes(), b = want.shards().shard(d).buffer.bytes();
    ASSERT_EQ(a.size(), b.size()) << "device " << d;
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "device " << d << ", " << got.sharding().to_string();
  }
}

// A weight gradient of few rows per device: one process sums the devices' products inside the
// product, several reduce them through the runtime; both must give the same bits (training on 1
// process and on 4 must agree bit for bit), reduced and then split over FSDP as an optimizer would.
TEST(MpiOps, WeightGradientsOfDeviceRowsMatchOneProcess) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  for (const char* text : {"data=8", "fsdp=4,tensor=2", "data=2,fsdp=4"}) {
    SCOPED_TRACE(text);
    const Mesh mesh = Mesh::parse(text);
    const bool data_only = mesh.has_axis("data") && mesh.axis_size("data") == 8;
    const PartitionSpec rows = data_only ? PartitionSpec{{"data"}, {}}
                                         : (mesh.has_axis("data") ? PartitionSpec{{"data", "fsdp"}, {}} : PartitionSpec{{"fsdp"}, {}});
    const int64_t n_rows = 200, k = 48, n = 72;
    std::vector<float> x(n_rows * k), g(n_rows * n);
    for (auto& v : x) v = dist(rng);
    for (auto& v : g) v = dist(rng);
    auto put = [&](Runtime& rt, const std::vector<float>& v, int64_t cols) {
      return Tensor(device_put(rt, HostArray::from<float>(Shape({n_rows, cols}), std::span<const float>(v)), NamedSharding(mesh, rows)));
    };
    // Summed in the product where packed_gemm runs (AVX2 or AVX-512), else left partial: reduced
    // by the runtime, in one process and across processes alike.
    const Tensor got = ops::reduce(ops::dot_tn(put(mpi(), x, k), put(mpi(), g, n)));
    const Tensor want = ops::reduce(ops::dot_tn(put(reference(), x, k), put(reference(), g, n)));
    expect_same_blocks(got, want);
    const NamedSharding split(mesh, PartitionSpec{{mesh.has_axis("fsdp") ? "fsdp" : "data"}, {}});
    expect_same_blocks(ops::reshard(got, split), ops::reshard(want, split));
  }
}

// A product whose one block per rank the rank spreads over its cores (data=2 with the weight
// replicated over tensor=4: each rank's devices share one block of the output), while one process
// of 8 devices runs each of its two blocks on one core: the same bits. oneDNN picks its kernel by
// each call's shape, so with [1200, 1000] x [1000, 1000] per block the two ways must cut it alike.
TEST(MpiOps, ProductsARankSpreadsOverItsCoresMatchOneProcess) {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist;
  const Mesh mesh = Mesh::parse("data=2,tensor=4");
  const int64_t rows = 2400, k = 1000, n = 1000;
  std::vector<float> x(rows * k), w(k * n);
  for (auto& v : x) v = dist(rng);
  for (auto& v : w) v = dist(rng);
  auto put = [&](Runtime& rt, const std::vector<float>& v, Shape shape, const PartitionSpec& spec) {
    return Tensor(device_put(rt, HostArray::from<float>(shape, std::span<const float>(v)), NamedSharding(mesh, spec)));
  };
  const PartitionSpec by_rows{{"data"}, {}};
  const Tensor got = ops::dot(put(mpi(), x, Shape({rows, k}), by_rows), put(mpi(), w, Shape({k, n}), {}));
  const Tensor want = ops::dot(put(reference(), x, Shape({rows, k}), by_rows), put(reference(), w, Shape({k, n}), {}));
  expect_same_blocks(got, want);
}

}  // namespace
}  // namespace tessel
