// The runtime across MPI ranks (run by ctest under mpirun at 2 and 4 ranks, 8 devices in all):
// every reshard and collective gives, on each rank's devices, bit for bit what the same call gives
// on 8 devices in one process, and each rank holds only its own devices' shards.
#include <mpi.h>

#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/mpi.h"
#include "tessel/runtime/reshard.h"

namespace tessel {
namespace {

constexpr int64_t kDevices = 8;

// The runtime under test (this rank's part of 8 devices) and the one-process reference.
Runtime& mpi() {
  static Runtime rt = [] {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return mpi_runtime({.devices = kDevices / size});
  }();
  return rt;
}
Runtime& reference() {
  static Runtime rt = Runtime::host(kDevices);
  return rt;
}

// A value per device and element, the same on every rank: per-device contributions expose a
// piece taken from the wrong device.
Array input(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& s) {
  const size_t item = item_size(dtype);
  return make_array_from_device_callback(rt, shape, dtype, s, [&](int64_t device, const Box& box, std::span<std::byte> out) {
    std::mt19937 rng(static_cast<uint32_t>(device * 7919 + box.volume()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(rng());
    if (dtype == DType::kBool) for (auto& b : out) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1);
    if (dtype == DType::kF32 || dtype == DType::kBF16) {  // finite values: NaN bits would compare unequal
      for (size_t i = 0; i + item <= out.size(); i += item) out[i + item - 1] &= std::byte{0x3f};
    }
  });
}

// This rank's shards of `got` equal the reference's, byte for byte; other ranks' are absent.
void expect_same_shards(const Array& got, const Array& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.sharding(), want.sharding());
  for (int64_t d : got.sharding().mesh().device_ids()) {
    if (!got.runtime().is_addressable(d)) {
      EXPECT_FALSE(got.shard(d).is_addressable()) << "device " << d;
      continue;
    }
    const auto a = got.shard(d).buffer.bytes(), b = want.shard(d).buffer.bytes();
    ASSERT_EQ(a.size(), b.size()) << "device " << d;
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "device " << d << ", " << got.sharding().to_string();
  }
}

TEST(Mpi, RanksOwnTheirDevices) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Runtime& rt = mpi();
  EXPECT_EQ(rt.process_index(), rank);
  EXPECT_EQ(rt.process_count(), size);
  EXPECT_EQ(rt.device_count(), kDevices);
  const int64_t k = rt.local_device_count();
  for (int64_t d = 0; d < kDevices; ++d) EXPECT_EQ(rt.is_addressable(d), d / k == rank) << d;
  // Only local devices allocate.
  const Mesh mesh = Mesh::parse("x=8");
  Array x = input(rt, {64, 8}, DType::kF32, NamedSharding(mesh, {}));
  for (int64_t d = 0; d < kDevices; ++d) {
    EXPECT_EQ(rt.device(d).memory_stats().in_use > 0, rt.is_addressable(d)) << d;
  }
}

TEST(Mpi, ReshardsMatchOneProcess) {
  std::mt19937 rng(20261122);
  const DType dtypes[] = {DType::kF32, DType::kI32, DType::kBF16, DType::kBool};
  const Mesh all({{"x", kDevices}});
  for (int iter = 0; iter < 60; ++iter) {
    const Mesh a = testing::random_mesh_over(rng, all), b = testing::random_mesh_over(rng, all);
    const Shape shape = testing::random_shape(rng);
    const DType dtype = dtypes[iter % 4];
    const NamedSharding from(a, testing::random_spec(rng, a, shape.rank()));
    const NamedSharding to(b, testing::random_spec(rng, b, shape.rank()));
    SCOPED_TRACE("iteration " + std::to_string(iter) + ": " + from.to_string() + " -> " + to.to_string());
    const Array x = input(mpi(), shape, dtype, from), r = input(reference(), shape, dtype, from);
    expect_same_shards(x, r);
    expect_same_shards(reshard(x, to), reshard(r, to));
  }
}

TEST(Mpi, CollectivesMatchOneProcess) {
  const Mesh mesh = Mesh::parse("a=2,b=2,c=2");
  const std::vector<std::vector<std::string>> sets = {{"a"}, {"b"}, {"c"}, {"a", "b"}, {"c", "a"}, {"a", "b", "c"}};
  for (const auto& axes : sets) {
    SCOPED_TRACE(::testing::PrintToString(axes));
    // all_gather: dimension 0 split over the axes.
    const NamedSharding sharded(mesh, PartitionSpec{DimSharding(axes.begin(), axes.end()), DimSharding{}});
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
      const Array x = input(mpi(), {16, 6}, dtype, sharded), r = input(reference(), {16, 6}, dtype, sharded);
      expect_same_shards(all_gather(x, axes), all_gather(r, axes));
      expect_same_shards(all_to_all(x, axes, 1, 0), all_to_all(r, axes, 1, 0));
      expect_same_shards(ppermute(x, axes.front(), 1), ppermute(r, axes.front(), 1));
      // Reductions over per-device contributions of a replicated array.
      const NamedSharding replicated(mesh, PartitionSpec{});
      const Array p = input(mpi(), {16, 6}, dtype, replicated), q = input(reference(), {16, 6}, dtype, replicated);
      for (Reduction op : {Reduction::kSum, Reduction::kMean, Reduction::kMax, Reduction::kMin}) {
        if (dtype == DType::kI32 && op == Reduction::kMean) continue;
        expect_same_shards(all_reduce(p, axes, op), all_reduce(q, axes, op));
        expect_same_shards(reduce_scatter(p, axes, 0, op), reduce_scatter(q, axes, 0, op));
      }
    }
  }
}

// Float sums depend on their order: 2^24 + 1 + ... - 2^24 is 0 one way round and 6 the other. The
// reduction across ranks must add in group order, as one process does.
TEST(Mpi, ReductionsAddInGroupOrder) {
  const Mesh mesh = Mesh::parse("a=2,b=2,c=2");
  auto make = [&](const Runtime& rt) {
    return make_array_from_device_callback(rt, {4}, DType::kF32, NamedSharding(mesh, {}),
                                           [](int64_t device, const Box&, std::span<std::byte> out) {
                                             const float v = device == 0 ? 16777216.0f : device == 7 ? -16777216.0f : 1.0f;
                                             for (size_t i = 0; i < out.size(); i += 4) std::memcpy(out.data() + i, &v, 4);
                                           });
  };
  const Array x = make(mpi()), r = make(reference());
  const Array sum = all_reduce(x, {"a", "b", "c"}, Reduction::kSum);
  expect_same_shards(sum, all_reduce(r, {"a", "b", "c"}, Reduction::kSum));
  expect_same_shards(all_reduce(x, {"c", "b", "a"}, Reduction::kSum), all_reduce(r, {"c", "b", "a"}, Reduction::kSum));
}

TEST(Mpi, DifferentConfigurationsAreReportedOnEveryRank) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_NO_THROW(check_same_on_all_ranks("mesh data=2,fsdp=4", "mesh"));
  const std::string mine = rank == size - 1 ? "mesh data=4,fsdp=2" : "mesh data=2,fsdp=4";
  EXPECT_THAT([&] { check_same_on_all_ranks(mine, "mesh"); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr(
                  "the mesh differs between ranks: rank 0 has 'mesh data=2,fsdp=4', rank " + std::to_string(size - 1) +
                  " has 'mesh data=4,fsdp=2'")));
}

}  // namespace
}  // namespace tessel

// Every rank runs every test; rank 0 prints, and the exit status is the worst of all ranks.
int main(int argc, char** argv) {
  tessel::MpiSession session(argc, argv);
  ::testing::InitGoogleMock(&argc, argv);
  if (session.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && rc == 0 && session.rank() == 0) std::cerr << "a test failed on another rank\n";
  return worst;
}
