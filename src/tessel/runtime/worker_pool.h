// A fixed set of worker threads that runs the per-device work of every operation. Sized to the
// machine's cores, not to the number of devices: 8 virtual devices on 2 cores use 2 threads.
//
//   tessel::WorkerPool pool(2);
//   pool.parallel_for(8, [&](int64_t i) { fill_shard(i); });   // returns when all 8 are done
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel {

class WorkerPool {
 public:
  // `threads` counts the calling thread too; 0 means std::thread::hardware_concurrency().
  explicit WorkerPool(int threads = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n) on the workers and the calling thread, and returns when all
  // have finished. The first exception thrown by any fn(i) is rethrown here (the other indices
  // still run). A call from inside fn (nested) runs inline on that thread.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  struct Job;
  void worker_loop();
  static void run(Job& job);

  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  // Written under mu_; read without it only to spin before a wait that checks again under mu_.
  std::atomic<uint64_t> posted_{0};  // generation_, or ~0 once stopping
  std::atomic<int> busy_{0};         // workers inside the current job
  bool stop_ = false;
};

}  // namespace tessel
