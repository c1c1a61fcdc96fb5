#include "tessel/runtime/worker_pool.h"

#include <atomic>
#include <chrono>

namespace tessel {
namespace {
thread_local bool t_in_pool = false;  // set while a thread runs a job's tasks

// Ops come back to back, most a few microseconds apart, some (the caller's own bookkeeping
// between them) a few hundred, and waking a sleeping thread takes tens of microseconds on a VM, on
// the step's critical path: before sleeping, a worker polls this long for the next job, and the
// caller this long for the workers to finish. At 100 us the LM's worker slept through many of its
// step's gaps (1 ms: its 1-device step 1.01x and 1.07x faster in two A/B runs of 160 rounds, the
// more the busier the machine). After the first kPauseSpin the thread yields between polls, so
// that on a busy machine (more runnable threads than cores: ctest -j, several processes per host)
// the wait gives its core away.
constexpr auto kSpin = std::chrono::microseconds(1000);
constexpr auto kPauseSpin = std::chrono::microseconds(50);

template <class Ready>
void spin_until(const Ready& ready) {
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (int i = 1; !ready(); ++i) {
    if (yielding) {
      std::this_thread::yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#else
      std::this_thread::yield();
#endif
    }
    if (yielding || i % 64 == 0) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > kSpin) return;
      yielding = waited > kPauseSpin;
    }
  }
}
}  // namespace

struct WorkerPool::Job {
  const std::function<void(int64_t)>* fn;
  int64_t n;
  std::atomic<int64_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
};

WorkerPool::WorkerPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    posted_.store(~uint64_t{0});
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::run(Job& job) {
  bool was_in_pool = t_in_pool;
  t_in_pool = true;
  for (int64_t i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < job.n;) {
    try {
      (*job.fn)(i);
    } catch (...) {
      std::lock_guard lock(job.error_mu);
      if (!job.error) job.error = std::current_exception();
    }
  }
  t_in_pool = was_in_pool;
}

void WorkerPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      if (!job) continue;
      ++busy_;
    }
    run(*job);
    {
      std::lock_guard lock(mu_);
      --busy_;
    }
    done_.notify_all();
  }
}

void WorkerPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || t_in_pool) {
    // Inline: same error contract (every index runs, the first exception is rethrown).
    std::exception_ptr error;
    for (int64_t i = 0; i < n; ++i) {
      try {
        fn(i);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  std::lock_guard submit(submit_mu_);
  Job job;
  job.fn = &fn;
  job.n = n;
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    ++generation_;
    posted_.store(generation_, std::memory_order_release);
  }
  wake_.notify_all();
  run(job);
  {
    // The job lives on this stack: wait until no worker is still inside it.
    spin_until([&] { return busy_.load(std::memory_order_acquire) == 0; });
    std::unique_lock lock(mu_);
    job_ = nullptr;
    done_.wait(lock, [&] { return busy_ == 0; });
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tessel
