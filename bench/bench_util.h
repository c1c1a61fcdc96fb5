// Shared by the benchmark binaries: the physical-limit baselines split a byte range over threads.
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

namespace tessel::bench {

// Runs fn(lo, hi) on `threads` threads over equal slices of [0, bytes) and joins them.
template <typename Fn>
void over_thread_slices(size_t threads, size_t bytes, Fn fn) {
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([=] { fn(bytes * t / threads, bytes * (t + 1) / threads); });
  for (auto& t : pool) t.join();
}

}  // namespace tessel::bench
