// Internal: the cosines and sines rotary embeddings rotate by, one table per (positions,
// frequencies, direction), kept between calls: a training step asks for the same few again and
// again (each layer's queries and keys, forward and back), and a table took longer to compute than
// the rotation itself. Shared by the rope ops and the attention op that rotates as it reads.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/runtime/worker_pool.h"

namespace tessel::ops::detail {

// cos and sign * sin of position s's angle s * freq[k], at [s * half + k] (half = freq.size()).
template <class T>
struct RopeTable {
  std::vector<T> cos, sin;
};

// The table for positions [0, seq), computed over the pool's cores on a miss.
template <class T>
std::shared_ptr<const RopeTable<T>> rope_table(WorkerPool& pool, int64_t seq, const std::vector<double>& freq,
                                               double sign);

// MaxText's default timescales: pair k of a head of d elements turns at 1 / max_timescale^(2k/d).
std::vector<double> default_rope_frequencies(double max_timescale, int64_t d);

}  // namespace tessel::ops::detail
