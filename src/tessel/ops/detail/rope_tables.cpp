#include "tessel/ops/detail/rope_tables.h"

#include <cmath>
#include <list>
#include <mutex>

namespace tessel::ops::detail {
namespace {

// Positions spread over the cores.
template <class T>
RopeTable<T> compute_rope_table(WorkerPool& pool, int64_t seq, const std::vector<double>& freq, double sign) {
  const auto half = static_cast<int64_t>(freq.size());
  RopeTable<T> t{std::vector<T>(static_cast<size_t>(seq * half)), std::vector<T>(static_cast<size_t>(seq * half))};
  constexpr int64_t kGrain = 16;  // positions per task
  pool.parallel_for((seq + kGrain - 1) / kGrain, [&](int64_t p) {
    for (int64_t s = p * kGrain; s < std::min(seq, (p + 1) * kGrain); ++s) {
      for (int64_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(s) * freq[k];
        t.cos[s * half + k] = static_cast<T>(std::cos(angle));
        t.sin[s * half + k] = static_cast<T>(sign * std::sin(angle));
      }
    }
  });
  return t;
}

// The tables last asked for, by their exact frequencies, length and sign.
template <class T>
class RopeTableCache {
 public:
  std::shared_ptr<const RopeTable<T>> get(WorkerPool& pool, int64_t seq, const std::vector<double>& freq,
                                          double sign) {
    {
      std::lock_guard lock(mu_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->seq == seq && it->sign == sign && it->freq == freq) {
          entries_.splice(entries_.begin(), entries_, it);  // most recent first
          return entries_.front().table;
        }
      }
    }
    // Computed outside the lock: the pool's tasks must not wait on it.
    auto table = std::make_shared<const RopeTable<T>>(compute_rope_table<T>(pool, seq, freq, sign));
    if (seq * static_cast<int64_t>(freq.size()) > kMaxElements) return table;
    std::lock_guard lock(mu_);
    entries_.push_front({seq, sign, freq, table});
    if (entries_.size() > kMaxEntries) entries_.pop_back();
    return table;
  }

 private:
  static constexpr size_t kMaxEntries = 8;
  static constexpr int64_t kMaxElements = int64_t{1} << 20;  // per table: 8 MiB of cos and sin as float
  struct Entry {
    int64_t seq;
    double sign;
    std::vector<double> freq;
    std::shared_ptr<const RopeTable<T>> table;
  };
  std::mutex mu_;
  std::list<Entry> entries_;
};

}  // namespace

template <class T>
std::shared_ptr<const RopeTable<T>> rope_table(WorkerPool& pool, int64_t seq, const std::vector<double>& freq,
                                               double sign) {
  static RopeTableCache<T> cache;
  return cache.get(pool, seq, freq, sign);
}

template std::shared_ptr<const RopeTable<float>> rope_table<float>(WorkerPool&, int64_t, const std::vector<double>&,
                                                                   double);
template std::shared_ptr<const RopeTable<double>> rope_table<double>(WorkerPool&, int64_t, const std::vector<double>&,
                                                                     double);

std::vector<double> default_rope_frequencies(double max_timescale, int64_t d) {
  std::vector<double> freq(static_cast<size_t>(d / 2));
  for (int64_t k = 0; k < d / 2; ++k)
    freq[static_cast<size_t>(k)] = 1.0 / std::pow(max_timescale, 2.0 * static_cast<double>(k) / static_cast<double>(d));
  return freq;
}

}  // namespace tessel::ops::detail
