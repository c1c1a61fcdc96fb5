// all_reduce and all_gather between MPI ranks, tessel against Open MPI's own MPI_Allreduce and
// MPI_Allgather on buffers of the same sizes, in the same run. Run under mpirun (bench/mpi_bench.sh):
//   mpirun -np 2 bench_mpi [MIN_MIB] [MAX_MIB]
// Rank 0 prints one JSON object per operation and size: the median over repetitions of the slowest
// rank's time, for tessel and for MPI.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "tessel/runtime/array.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/mpi.h"

namespace {

using Clock = std::chrono::steady_clock;

double slowest_rank(const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  fn();
  double mine = std::chrono::duration<double>(Clock::now() - t0).count(), slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The medians over repetitions of the slowest rank's seconds for `ours` and `theirs`, taken in
// turns so both see the same moments of a noisy machine (after two warm-up calls each).
std::pair<double, double> time_pair(const std::function<void()>& ours, const std::function<void()>& theirs,
                                    int64_t bytes) {
  for (int i = 0; i < 2; ++i) {
    ours();
    theirs();
  }
  const int reps = static_cast<int>(std::clamp<int64_t>((int64_t{4} << 30) / std::max<int64_t>(bytes, 1), 9, 201));
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    a.push_back(slowest_rank(ours));
    b.push_back(slowest_rank(theirs));
  }
  return {median(a), median(b)};
}

}  // namespace

int main(int argc, char** argv) {
  tessel::MpiSession mpi(argc, argv);
  const int64_t min_mib = argc > 1 ? std::atoll(argv[1]) : 1, max_mib = argc > 2 ? std::atoll(argv[2]) : 256;
  const int n = mpi.size();
  // One device per rank and one worker thread, as MPI has one thread per rank.
  tessel::Runtime rt = tessel::mpi_runtime({.devices = 1, .threads = 1});
  const tessel::Mesh mesh({{"x", n}});
  for (int64_t mib = min_mib; mib <= max_mib; mib *= 2) {
    const int64_t bytes = mib << 20, floats = bytes / 4;
    // all_reduce: every rank contributes `bytes`, every rank gets the sum.
    const tessel::Array contrib = tessel::make_array_from_device_callback(
        rt, {floats}, tessel::DType::kF32, tessel::NamedSharding(mesh, {}),
        [](int64_t device, const tessel::Box&, std::span<std::byte> out) {
          auto* f = reinterpret_cast<float*>(out.data());
          for (size_t i = 0; i < out.size() / 4; ++i) f[i] = static_cast<float>(device + 1) * 0.5f;
        });
    std::vector<float> send(static_cast<size_t>(floats), 1.0f), recv(static_cast<size_t>(floats), 0.0f);
    const auto [ours, theirs] = time_pair(
        [&] { tessel::all_reduce(contrib, {"x"}, tessel::Reduction::kSum); },
        [&] { MPI_Allreduce(send.data(), recv.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        bytes);
    // all_gather: every rank holds bytes / n, every rank gets all `bytes`.
    const tessel::Array rows = tessel::make_array_from_callback(
        rt, {floats}, tessel::DType::kF32, tessel::NamedSharding(mesh, {{"x"}}),
        [](const tessel::Box&, std::span<std::byte> out) { std::memset(out.data(), 1, out.size()); });
    const auto [ours_g, theirs_g] = time_pair(
        [&] { tessel::all_gather(rows, {"x"}); },
        [&] {
          MPI_Allgather(send.data(), static_cast<int>(floats / n), MPI_FLOAT, recv.data(), static_cast<int>(floats / n),
                        MPI_FLOAT, MPI_COMM_WORLD);
        },
        bytes);
    if (mpi.rank() == 0) {
      std::printf("{\"op\": \"all_reduce\", \"bytes\": %lld, \"tessel_s\": %.6g, \"mpi_s\": %.6g}\n",
                  static_cast<long long>(bytes), ours, theirs);
      std::printf("{\"op\": \"all_gather\", \"bytes\": %lld, \"tessel_s\": %.6g, \"mpi_s\": %.6g}\n",
                  static_cast<long long>(bytes), ours_g, theirs_g);
      std::fflush(stdout);
    }
  }
  return 0;
}
