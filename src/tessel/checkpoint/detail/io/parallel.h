// Internal (not installed): the checkpoint layer's worker pools, byte budgets and path splitting.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace tessel::detail {

// `requested` threads, or by default one per core within [floor, 16].
inline int default_threads(int requested, int floor) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(cores, floor, 16);
}

// Runs fn(i), or fn(i, worker) with worker in [0, threads), for i in [0, n) on `threads`
// threads; rethrows the first failure after all stop.
template <class Fn>
void run_parallel(int64_t n, int threads, Fn&& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&](int worker) {
    for (int64_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        if constexpr (std::is_invocable_v<Fn&, int64_t, int>) {
          fn(i, worker);
        } else {
          fn(i);
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const int extra = static_cast<int>(std::min<int64_t>(threads, n)) - 1;
  std::vector<std::thread> pool;
  for (int t = 0; t < extra; ++t) pool.emplace_back(work, t + 1);
  work(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// Host bytes held at once by parallel workers (a restore's staging, a conversion's pieces):
// callers take bytes before they allocate and give them back after; a request above the budget
// waits until it has the budget to itself.
class ByteBudget {
 public:
  explicit ByteBudget(int64_t budget) : budget_(std::max<int64_t>(budget, 1)) {}
  int64_t acquire(int64_t bytes) {
    std::unique_lock lock(mu_);
    const int64_t want = std::min(bytes, budget_);
    cv_.wait(lock, [&] { return used_ + want <= budget_; });
    used_ += want;
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    return want;
  }
  void release(int64_t taken, int64_t bytes) {
    {
      std::lock_guard lock(mu_);
      used_ -= taken;
      held_ -= bytes;
    }
    cv_.notify_all();
  }
  int64_t peak() const { return peak_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int64_t budget_;
  int64_t used_ = 0;
  int64_t held_ = 0;
  int64_t peak_ = 0;
};

// Holds budget bytes for one scope.
class ByteLease {
 public:
  ByteLease(ByteBudget& budget, int64_t bytes) : budget_(budget), bytes_(bytes), taken_(budget.acquire(bytes)) {}
  ~ByteLease() { budget_.release(taken_, bytes_); }
  ByteLease(const ByteLease&) = delete;
  ByteLease& operator=(const ByteLease&) = delete;

 private:
  ByteBudget& budget_;
  int64_t bytes_, taken_;
};

// "a/b/c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    keys.push_back(path.substr(start, slash - start));
    if (slash == std::string::npos) return keys;
    start = slash + 1;
  }
}

}  // namespace tessel::detail
