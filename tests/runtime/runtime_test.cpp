#include "tessel/runtime/runtime.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"
#include "tessel/core/error.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/inspect.h"
#include "tessel/runtime/reshard.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_.empty()) unsetenv(name_);
    else setenv(name_, old_.c_str(), 1);
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(Runtime, HostHasTheRequestedDevices) {
  auto rt = Runtime::host(4);
  EXPECT_EQ(rt.device_count(), 4);
  EXPECT_EQ(rt.device(3).id(), 3);
  EXPECT_EQ(rt.process_count(), 1);
  EXPECT_TRUE(rt.is_addressable(2));
  EXPECT_THAT([&] { rt.device(4); }, ThrowsMessage<ValueError>(HasSubstr("devices 0 to 3")));
  EXPECT_THAT([] { Runtime::host(0); }, ThrowsMessage<ValueError>(HasSubstr("1 to 4096 devices, got 0")));
}

TEST(Runtime, DeviceCountComesFromTheEnvironmentOrDefaultsToEight) {
  {
    ScopedEnv env("TESSEL_DEVICES", nullptr);
    EXPECT_EQ(Runtime::host().device_count(), 8);
  }
  {
    ScopedEnv env("TESSEL_DEVICES", "3");
    EXPECT_EQ(Runtime::host().device_count(), 3);
    EXPECT_EQ(Runtime::host(5).device_count(), 5);  // an explicit count wins
  }
  for (const char* bad : {"", "0", "-2", "8x", "99999", "two"}) {
    ScopedEnv env("TESSEL_DEVICES", bad);
    EXPECT_THAT([] { Runtime::host(); },
                ThrowsMessage<ValueError>(HasSubstr("TESSEL_DEVICES must be a device count")))
        << bad;
  }
}

TEST(Runtime, CheckMeshNamesTheMissingDevice) {
  auto rt = Runtime::host(4);
  EXPECT_NO_THROW(rt.check_mesh(Mesh::parse("a=2,b=2")));
  EXPECT_THAT([&] { rt.check_mesh(Mesh::parse("a=8")); },
              ThrowsMessage<ValueError>(HasSubstr("uses device 4, but the runtime has devices 0 to 3")));
}

TEST(Runtime, PartOfAJobHoldsOnlyItsOwnDevices) {
  // A JAX job's 8 devices, owned by 2 processes in no particular order; this is process 0.
  const std::vector<int> owners = {1, 0, 1, 0, 0, 1, 1, 0};
  const Runtime rt = Runtime::part_of_job(owners, 0);
  EXPECT_EQ(rt.device_count(), 8);
  EXPECT_EQ(rt.process_count(), 2);
  EXPECT_EQ(rt.process_index(), 0);
  EXPECT_EQ(rt.local_device_count(), 4);
  for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(rt.is_addressable(d), owners[static_cast<size_t>(d)] == 0) << d;
  // Its devices get their blocks; the others' are placeholders holding nothing here.
  const HostArray host = testing::iota({8, 2});
  const NamedSharding rows(Mesh::parse("x=8"), {{"x"}});
  const Array a = device_put(rt, host, rows);
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_EQ(a.shard(d).is_addressable(), rt.is_addressable(d)) << d;
    EXPECT_EQ(rt.device(d).memory_stats().in_use, rt.is_addressable(d) ? 8 : 0) << d;
  }
  // Moving bytes between processes is the framework's job: refused, naming the device.
  EXPECT_THAT([&] { reshard(a, NamedSharding(Mesh::parse("x=8"), {})); },
              ThrowsMessage<ValueError>(HasSubstr("not addressable in this process")));
  EXPECT_THAT([] { Runtime::part_of_job(std::vector<int>{}, 0); }, ThrowsMessage<ValueError>(HasSubstr("1 to 4096 devices")));
  EXPECT_THAT([] { Runtime::part_of_job(std::vector<int>{0, -1}, 0); },
              ThrowsMessage<ValueError>(HasSubstr("must not be negative")));
  EXPECT_THAT([] { Runtime::part_of_job(std::vector<int>{0, 1}, 2); },
              ThrowsMessage<ValueError>(HasSubstr("process 2 owns none of the job's 2 devices")));
}

TEST(WorkerPool, IsSizedToTheMachineNotToTheDevices) {
  EXPECT_EQ(WorkerPool().size(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto rt = Runtime::host(64);
  EXPECT_EQ(rt.pool().size(), WorkerPool().size());
}

TEST(WorkerPool, RunsEveryIndexOnce) {
  WorkerPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  pool.parallel_for(0, [&](int64_t) { FAIL(); });
}

TEST(WorkerPool, RethrowsTheFirstErrorAfterAllIndicesRan) {
  WorkerPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(50, [&](int64_t i) {
                 ran++;
                 if (i % 10 == 3) throw std::runtime_error("task failed");
               }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 50);
  // The pool still works afterwards.
  std::atomic<int> again{0};
  pool.parallel_for(8, [&](int64_t) { again++; });
  EXPECT_EQ(again.load(), 8);
}

TEST(WorkerPool, NestedCallsRunInline) {
  WorkerPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t) { pool.parallel_for(4, [&](int64_t) { inner++; }); });
  EXPECT_EQ(inner.load(), 16);
}

// Workers poll for the next job for about a millisecond after each one, then sleep: an idle pool
// burns no CPU (polling for good would cost 3 cores here). Measured on the CPU clocks of the
// threads that ran the job: the process's clock also counts other libraries' threads (OpenBLAS's
// spins about 0.1 s after it starts, which failed this test under the sanitizers).
TEST(WorkerPool, AnIdlePoolSleeps) {
  WorkerPool pool(4);
  std::mutex mu;
  std::vector<clockid_t> clocks;
  std::vector<std::thread::id> seen;
  pool.parallel_for(64, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // every worker gets some
    std::lock_guard lock(mu);
    if (std::find(seen.begin(), seen.end(), std::this_thread::get_id()) != seen.end()) return;
    seen.push_back(std::this_thread::get_id());
    clockid_t c{};
    ASSERT_EQ(pthread_getcpuclockid(pthread_self(), &c), 0);
    clocks.push_back(c);
  });
  EXPECT_GE(clocks.size(), 3u) << "the job ran on too few of the pool's threads to measure them";
  auto cpu_seconds = [&] {
    double sum = 0;
    for (clockid_t c : clocks) {
      timespec t{};
      clock_gettime(c, &t);
      sum += static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
    }
    return sum;
  };
  const double cpu0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(cpu_seconds() - cpu0, 0.03) << "the pool's threads kept running while it was idle";
}

TEST(DeviceMemory, AccountsInUsePeakAndHolders) {
  Device d(0, 0, std::nullopt);
  std::byte* a = d.allocate(1000, "params/w");
  std::byte* b = d.allocate(24, "params/b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(d.memory_stats().in_use, 1024);
  EXPECT_EQ(d.memory_stats().buffers, 2);
  auto holders = d.memory_holders();
  ASSERT_EQ(holders.size(), 2u);
  EXPECT_EQ(holders[0].label, "params/w");
  d.deallocate(a, 1000, "params/w");
  EXPECT_EQ(d.memory_stats().in_use, 24);
  EXPECT_EQ(d.memory_stats().peak, 1024);
  d.reset_peak();
  EXPECT_EQ(d.memory_stats().peak, 24);
  d.deallocate(b, 24, "params/b");
  EXPECT_EQ(d.memory_stats().in_use, 0);
  EXPECT_TRUE(d.memory_holders().empty());
  EXPECT_EQ(d.allocate(0, "empty"), nullptr);
  EXPECT_EQ(d.memory_stats().buffers, 0);
}

TEST(DeviceMemory, LimitRaisesOutOfMemoryNamingDeviceRequestAndHolders) {
  Device d(3, 0, int64_t{4} << 20);
  std::byte* w = d.allocate(int64_t{3} << 20, "params/w");
  try {
    d.allocate(int64_t{2} << 20, "opt/mu");
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.device(), 3);
    EXPECT_EQ(e.requested(), int64_t{2} << 20);
    EXPECT_THAT(e.what(), AllOf(HasSubstr("device 3: out of memory"), HasSubstr("2.00 MiB for opt/mu"),
                                HasSubstr("limit 4.00 MiB"), HasSubstr("in use 3.00 MiB"),
                                HasSubstr("params/w 3.00 MiB in 1 buffer")));
  }
  EXPECT_EQ(d.memory_stats().in_use, int64_t{3} << 20);  // the failed request left no trace
  d.deallocate(w, int64_t{3} << 20, "params/w");
  EXPECT_NO_THROW(d.deallocate(d.allocate(int64_t{4} << 20, "fits"), int64_t{4} << 20, "fits"));
  EXPECT_THAT([&] { d.set_memory_limit(-1); }, ThrowsMessage<ValueError>(HasSubstr("must not be negative")));
}

TEST(DeviceMemory, FreedLargeBlocksAreReusedAndCountAgainstTheLimit) {
  Device d(0, 0, std::nullopt);
  const int64_t big = int64_t{8} << 20;
  std::byte* a = d.allocate(big, "a");
  d.deallocate(a, big, "a");
  EXPECT_EQ(d.memory_stats().cached, big);
  EXPECT_EQ(d.memory_stats().in_use, 0);
  std::byte* b = d.allocate(big, "b");
  EXPECT_EQ(a, b);  // the same block back, no fresh page faults
  EXPECT_EQ(d.memory_stats().cached, 0);
  d.deallocate(b, big, "b");
  // A limit that the cache would break: the cache is dropped, the allocation succeeds.
  d.set_memory_limit(big + (int64_t{4} << 20));
  std::byte* c = d.allocate(int64_t{6} << 20, "c");
  EXPECT_EQ(d.memory_stats().cached, 0);
  d.deallocate(c, int64_t{6} << 20, "c");
  d.release_cached_memory();
  EXPECT_EQ(d.memory_stats().cached, 0);
}

TEST(DeviceMemory, TheBlockFreedLastIsReusedFirst) {
  // Of several cached blocks of one size, the one freed last comes back (its bytes are the
  // likeliest to be in the CPU's caches); then the one before it.
  Device d(0, 0, std::nullopt);
  const int64_t size = int64_t{2} << 20;
  std::vector<std::byte*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(d.allocate(size, "x"));
  for (std::byte* b : blocks) d.deallocate(b, size, "x");
  std::vector<std::byte*> again;
  again.push_back(d.allocate(size, "y"));
  again.push_back(d.allocate(size, "y"));
  EXPECT_EQ(again[0], blocks[2]);
  EXPECT_EQ(again[1], blocks[1]);
  // A block of another size is not taken for this one.
  std::byte* other = d.allocate(size + 4096, "z");
  EXPECT_NE(other, blocks[0]);
  again.push_back(d.allocate(size, "y"));
  EXPECT_EQ(again[2], blocks[0]);
  for (std::byte* b : again) d.deallocate(b, size, "y");
  d.deallocate(other, size + 4096, "z");
}

TEST(DeviceMemory, ArraysChargeTheirLabelAndTheTableShowsIt) {
  auto rt = Runtime::host(2);
  NamedSharding rows(Mesh::parse("d=2"), {{"d"}});
  {
    Array x = device_put(rt, testing::iota(Shape{64, 4}, DType::kF32), rows, "params/embed");
    EXPECT_EQ(rt.device(1).memory_stats().in_use, 32 * 4 * 4);
    std::string table = memory_table(rt);
    EXPECT_THAT(table, AllOf(HasSubstr("params/embed 512 B"), HasSubstr("in use"), HasSubstr("none")));
    Array y = device_put(rt, testing::iota(Shape{3}, DType::kF32), rows);
    EXPECT_EQ(rt.device(0).memory_holders().back().label, "f32[3]");
  }
  EXPECT_EQ(rt.device(0).memory_stats().in_use, 0);
  EXPECT_EQ(rt.device(1).memory_stats().in_use, 0);
}

TEST(DeviceMemory, ArrayOverTheLimitFailsWithoutLeaking) {
  RuntimeOptions options;
  options.devices = 2;
  options.memory_limit = 1000;
  auto rt = Runtime::host(options);
  NamedSharding replicated(Mesh::parse("d=2"), {});
  EXPECT_THAT([&] { device_put(rt, testing::iota(Shape{300}, DType::kF32), replicated, "big"); },
              ThrowsMessage<OutOfMemoryError>(HasSubstr("cannot allocate 1.17 KiB for big")));
  EXPECT_EQ(rt.device(0).memory_stats().in_use, 0);
  EXPECT_EQ(rt.device(1).memory_stats().in_use, 0);
}

}  // namespace
}  // namespace tessel
