// The runtime across MPI ranks (run by ctest under mpirun at 2 and 4 ranks, 8 devices in all):
// every reshard and collective gives, on each rank's devices, bit for bit what the same call gives
// on 8 devices in one process, and each rank holds only its own devices' shards.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/box_copy.h"
#include "mpi_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/mpi.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/reshard.h"

namespace tessel {
namespace {

constexpr int64_t kDevices = testing::kMpiDevices;
using testing::mpi;
using testing::reference;

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

// Values per block, equal on its replicas (the invariant a reshard relies on: it copies from any
// one replica and stores a process's replicas once); a piece from the wrong block still shows.
Array block_input(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& s) {
  const HostArray values = to_host(input(reference(), shape, dtype, NamedSharding(s.mesh(), {})));
  return device_put(rt, values, s);
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
    const Array x = block_input(mpi(), shape, dtype, from), r = block_input(reference(), shape, dtype, from);
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

TEST(Mpi, GatherAssemblesTheArrayOnOneProcess) {
  std::mt19937 rng(7);
  const Mesh all({{"x", kDevices}});
  const int processes = mpi().process_count();
  for (int iter = 0; iter < 30; ++iter) {
    const Mesh m = testing::random_mesh_over(rng, all);
    const Shape shape = testing::random_shape(rng);
    const NamedSharding s(m, testing::random_spec(rng, m, shape.rank()));
    SCOPED_TRACE(s.to_string() + " " + shape.to_string());
    const Array x = input(mpi(), shape, DType::kF32, s);
    const HostArray want = to_host(input(reference(), shape, DType::kF32, s));
    const int root = iter % processes;
    const std::optional<HostArray> got = gather(x, root);
    ASSERT_EQ(got.has_value(), mpi().process_index() == root);
    if (got) EXPECT_TRUE(std::ranges::equal(got->bytes(), want.bytes()));
  }
  // to_host refuses what this process does not hold whole.
  const Array rows = input(mpi(), {16, 4}, DType::kF32, NamedSharding(Mesh::parse("x=8"), {{"x"}}));
  EXPECT_THAT([&] { to_host(rows); }, ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("gather() it")));
  EXPECT_THAT([&] { gather(rows, processes); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("process " + std::to_string(processes) + " does not exist")));
}

TEST(Mpi, ProcessLocalDataBuildsTheGlobalArray) {
  const int p = mpi().process_index();
  struct Case {
    const char* mesh;
    PartitionSpec spec;
  };
  const std::vector<Case> cases = {{"x=8", {{"x"}}},                        // a batch's rows over every device
                                   {"data=2,tensor=4", {{"data"}, {"tensor"}}},
                                   {"data=4,fsdp=2", {{"data", "fsdp"}}},
                                   {"data=2,tensor=4", {{"data"}}}};       // replicated over tensor
  for (const Case& c : cases) {
    const NamedSharding s(Mesh::parse(c.mesh), c.spec);
    SCOPED_TRACE(s.to_string());
    const Shape shape{16, 8};
    const HostArray global = to_host(input(reference(), shape, DType::kI32, NamedSharding(Mesh::parse("x=8"), {})));
    // This process's part: the box its devices' blocks cover.
    Box part;
    bool first = true;
    for (int64_t d = 0; d < kDevices; ++d) {
      if (!mpi().is_addressable(d)) continue;
      const Box b = s.device_box(d, shape);
      if (first) part = b;
      std::vector<int64_t> lo(2), hi(2);
      for (size_t k = 0; k < 2; ++k) {
        lo[k] = std::min(part.start(k), b.start(k));
        hi[k] = std::max(part.stop(k), b.stop(k));
      }
      part = Box(lo, hi);
      first = false;
    }
    HostArray local(part.shape(), DType::kI32);
    copy_region(global.bytes().data(), Box::full(shape), local.mutable_bytes().data(), part, part, 4);
    const Array x = make_array_from_process_local_data(mpi(), s, local);
    EXPECT_EQ(x.shape(), shape);
    expect_same_shards(x, device_put(reference(), global, s));
  }
  // Devices of one process interleaved with another's: their blocks are not one box.
  const Mesh interleaved({{"x", kDevices}}, {0, 4, 1, 5, 2, 6, 3, 7});
  HostArray local(Shape{8, 8}, DType::kI32);
  EXPECT_THAT([&] { make_array_from_process_local_data(mpi(), NamedSharding(interleaved, {{"x"}}), local, Shape{16, 8}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr(
                  "the blocks of process " + std::to_string(p) + " under")));
  const HostArray wrong(Shape{3, 8}, DType::kI32);
  EXPECT_THAT([&] { make_array_from_process_local_data(mpi(), NamedSharding(Mesh::parse("x=8"), {{"x"}}), wrong, Shape{16, 8}); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr("its local data must have shape")));
}

TEST(Mpi, DifferentConfigurationsAreReportedOnEveryRank) {
  ProcessGroup& g = mpi().processes();
  EXPECT_NO_THROW(check_same(g, "mesh data=2,fsdp=4", "mesh"));
  const int last = g.count() - 1;
  const std::string mine = g.index() == last ? "mesh data=4,fsdp=2" : "mesh data=2,fsdp=4";
  EXPECT_THAT([&] { check_same(g, mine, "mesh"); },
              ::testing::ThrowsMessage<ValueError>(::testing::HasSubstr(
                  "the mesh differs between processes: process 0 has 'mesh data=2,fsdp=4', process " +
                  std::to_string(last) + " has 'mesh data=4,fsdp=2'")));
}

TEST(Mpi, AFailureInRunTogetherIsEveryonesError) {
  ProcessGroup& g = mpi().processes();
  const std::vector<std::string> all = gather_together(g, "naming", [&] { return "p" + std::to_string(g.index()); });
  ASSERT_EQ(all.size(), static_cast<size_t>(g.count()));
  for (int p = 0; p < g.count(); ++p) EXPECT_EQ(all[static_cast<size_t>(p)], "p" + std::to_string(p));
  const int failing = g.count() - 1;
  auto step = [&] {
    run_together(g, "writing step 3", [&] {
      if (g.index() == failing) throw IoError("disk full at /ckpt/3");
    });
  };
  if (g.index() == failing) {
    EXPECT_THAT(step, ::testing::ThrowsMessage<IoError>(::testing::StrEq("disk full at /ckpt/3")));
  } else {
    EXPECT_THAT(step, ::testing::ThrowsMessage<Error>(::testing::StrEq(
                          "writing step 3 failed on process " + std::to_string(failing) + ": disk full at /ckpt/3")));
  }
}

TEST(Mpi, AProcessThatDoesNotArriveIsNamed) {
  // A group with a 1 s timeout; the last process arrives 3 s late.
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Runtime rt = mpi_runtime({.devices = kDevices / size, .meeting_timeout = std::chrono::seconds(1)});
  ProcessGroup& g = rt.processes();
  const int late = g.count() - 1;
  if (g.index() == late) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    // Process 0 gave up on us and will not answer this round either.
    EXPECT_THAT([&] { g.all_gather("late", "step 9's barrier"); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr("step 9's barrier: process 0 did not answer within 1 s")));
  } else if (g.index() == 0) {
    EXPECT_THAT([&] { g.all_gather("early", "step 9's barrier"); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                    "step 9's barrier: process " + std::to_string(late) + " did not arrive within 1 s")));
  } else {
    EXPECT_THAT([&] { g.all_gather("early", "step 9's barrier"); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr("step 9's barrier: process 0 did not answer within 1 s")));
  }
  // The late message is still queued at process 0: a fresh group is clean. Everyone meets again.
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tessel
