// Runtime hot paths against the machine's own memcpy, all in one run (bench/runtime_bench.sh
// prints the ratios): resharding and collectives of a 1 GiB f32 array on 8 virtual devices, and
// the per-operation overhead on tiny arrays.
#include <cstring>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench_util.h"

#include "tessel/runtime/array.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/reshard.h"

namespace {

using namespace tessel;

constexpr int64_t kSide = 16384;  // 16384^2 f32 = 1 GiB
constexpr int64_t kDevices = 8;

Runtime& runtime() {
  static Runtime rt = Runtime::host(kDevices);
  return rt;
}

Mesh mesh() { return Mesh::parse("fsdp=8"); }

Array filled(const Shape& shape, const PartitionSpec& spec) {
  return make_array_from_callback(runtime(), shape, DType::kF32, NamedSharding(mesh(), spec),
                                  [](const Box&, std::span<std::byte> out) {
                                    std::memset(out.data(), 0x3f, out.size());
                                  });
}

// A replicated array whose devices hold different values in buffers of their own, as gradients
// before their all_reduce do (`filled` lets the replicas in one process share one buffer).
Array per_device(const Shape& shape) {
  return make_array_from_device_callback(runtime(), shape, DType::kF32, NamedSharding(mesh(), {}),
                                         [](int64_t device, const Box&, std::span<std::byte> out) {
                                           std::memset(out.data(), 0x3c + static_cast<int>(device), out.size());
                                         });
}

int64_t bytes_received() {
  int64_t n = 0;
  for (int64_t d = 0; d < kDevices; ++d) n += runtime().device(d).memory_stats().bytes_received;
  return n;
}

// The counters every figure reports: bytes the operation writes (per second, as memcpy's), and
// the bytes that crossed devices against the lower bound.
void report(benchmark::State& state, int64_t written, int64_t crossed, int64_t lower_bound) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * written);
  state.counters["crossed_per_op"] = static_cast<double>(crossed) / static_cast<double>(state.iterations());
  state.counters["lower_bound"] = static_cast<double>(lower_bound);
}

void BM_Memcpy(benchmark::State& state) {
  const auto threads = static_cast<size_t>(state.range(0));
  const size_t bytes = size_t{1} << 30;
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);  // fault the pages in: the copy is what is timed
  for (auto _ : state) {
    bench::over_thread_slices(threads, bytes, [&](size_t lo, size_t hi) {
      std::memcpy(dst.get() + lo, src.get() + lo, hi - lo);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Memcpy)->Arg(1)->Arg(2)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

// The same copy with streaming stores (the routine tessel's large copies use), 2 threads: on some
// machines faster than glibc's memcpy at this size, so the reference is the faster of the two.
void BM_StreamCopy(benchmark::State& state) {
  const size_t bytes = size_t{1} << 30;
  std::unique_ptr<std::byte[]> src(new std::byte[bytes]), dst(new std::byte[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);
  for (auto _ : state) {
    bench::over_thread_slices(2, bytes, [&](size_t lo, size_t hi) {
      detail::stream_copy(dst.get() + lo, src.get() + lo, hi - lo);
      detail::stream_fence();
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_StreamCopy)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

// Reshard between two specs of the 1 GiB array; target buffers come back from the device cache
// after the first iteration, as in a training loop.
void reshard_case(benchmark::State& state, const PartitionSpec& from, const PartitionSpec& to) {
  {
    Array x = filled(Shape{kSide, kSide}, from);
    NamedSharding target(mesh(), to);
    ReshardPlan plan = plan_reshard(x, target);
    int64_t written = 0;  // target bytes copied (a buffer shared with the source copies nothing)
    for (const Transfer& t : plan.transfers()) written += t.region.volume() * 4;
    { Array warm = reshard(x, target); }
    int64_t before = bytes_received();
    for (auto _ : state) {
      Array y = reshard(x, target);
      benchmark::DoNotOptimize(y);
    }
    report(state, written, bytes_received() - before, plan.bytes_received());
  }
  runtime().release_cached_memory();
}

void BM_ReshardRowsToColumns(benchmark::State& s) { reshard_case(s, {{"fsdp"}}, {{}, {"fsdp"}}); }
void BM_ReshardReplicatedToSharded(benchmark::State& s) { reshard_case(s, {}, {{"fsdp"}}); }
void BM_ReshardShardedToReplicated(benchmark::State& s) { reshard_case(s, {{"fsdp"}}, {}); }
BENCHMARK(BM_ReshardRowsToColumns)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReshardReplicatedToSharded)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReshardShardedToReplicated)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_AllGather(benchmark::State& state) {
  {
    Array x = filled(Shape{kSide, kSide}, {{"fsdp"}});
    const int64_t out = int64_t{1} << 30;
    { Array warm = all_gather(x, {"fsdp"}); }
    int64_t before = bytes_received();
    for (auto _ : state) {
      Array y = all_gather(x, {"fsdp"});
      benchmark::DoNotOptimize(y);
    }
    // Each device receives the 7/8 of the array it lacks.
    report(state, kDevices * out, bytes_received() - before, kDevices * out / kDevices * (kDevices - 1));
  }
  runtime().release_cached_memory();
}
BENCHMARK(BM_AllGather)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

// Reductions: every device holds a 128 MiB contribution of its own (1 GiB over the 8 devices).
constexpr int64_t kRows = kSide / kDevices;

// Arg 0: split on dimension 0 (each device's block is contiguous in the inputs). Arg 1: the same
// bytes split on the last dimension of a narrow array, each device's block a strip of 32-float
// rows (the FSDP weight gradients of an LM whose embed, 256, is the split dimension).
void BM_ReduceScatter(benchmark::State& state) {
  {
    const bool strips = state.range(0) == 1;
    constexpr int64_t kWidth = 256;
    Array x = per_device(strips ? Shape{kRows * kSide / kWidth, kWidth} : Shape{kRows, kSide});
    const size_t dim = strips ? 1 : 0;
    const int64_t in = kRows * kSide * 4;
    { Array warm = reduce_scatter(x, {"fsdp"}, dim); }
    int64_t before = bytes_received();
    for (auto _ : state) {
      Array y = reduce_scatter(x, {"fsdp"}, dim);
      benchmark::DoNotOptimize(y);
    }
    // Bytes processed: every input byte is read once (the output is 1/8 of that again).
    report(state, kDevices * in, bytes_received() - before, in / kDevices * (kDevices - 1) * kDevices);
  }
  runtime().release_cached_memory();
}
BENCHMARK(BM_ReduceScatter)->Arg(0)->Arg(1)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_AllReduce(benchmark::State& state) {
  {
    Array x = per_device(Shape{kRows, kSide});
    const int64_t in = kRows * kSide * 4;
    { Array warm = all_reduce(x, {"fsdp"}, Reduction::kSum); }
    int64_t before = bytes_received();
    for (auto _ : state) {
      Array y = all_reduce(x, {"fsdp"}, Reduction::kSum);
      benchmark::DoNotOptimize(y);
    }
    // Bytes processed: the inputs read once; the lower bound on traffic is 2 (n - 1) / n per device.
    report(state, kDevices * in, bytes_received() - before, 2 * in / kDevices * (kDevices - 1) * kDevices);
  }
  runtime().release_cached_memory();
}
BENCHMARK(BM_AllReduce)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

// Per-operation overhead: an 8x8 f32 array on 8 devices.
void BM_TinyReshard(benchmark::State& state) {
  Array x = filled(Shape{8, 8}, {{"fsdp"}});
  NamedSharding cols(mesh(), {{}, {"fsdp"}});
  for (auto _ : state) benchmark::DoNotOptimize(reshard(x, cols));
}
void BM_TinyAllGather(benchmark::State& state) {
  Array x = filled(Shape{8, 8}, {{"fsdp"}});
  for (auto _ : state) benchmark::DoNotOptimize(all_gather(x, {"fsdp"}));
}
void BM_TinyAllReduce(benchmark::State& state) {
  Array x = filled(Shape{8, 8}, {});
  for (auto _ : state) benchmark::DoNotOptimize(all_reduce(x, {"fsdp"}, Reduction::kSum));
}
void BM_TinyDevicePut(benchmark::State& state) {
  HostArray host(Shape{8, 8}, DType::kF32);
  NamedSharding rows(mesh(), {{"fsdp"}});
  for (auto _ : state) benchmark::DoNotOptimize(device_put(runtime(), host, rows));
}
BENCHMARK(BM_TinyReshard)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TinyAllGather)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TinyAllReduce)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TinyDevicePut)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
