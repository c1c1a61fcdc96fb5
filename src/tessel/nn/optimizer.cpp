#include "tessel/nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/nn/detail/optimizer_kernels.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/vmath.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel::nn {
namespace {

std::string mu_path(const std::string& p) { return std::string(kOptState) + "/mu/" + p; }
std::string nu_path(const std::string& p) { return std::string(kOptState) + "/nu/" + p; }

void check_same_layout(const Array& a, const Array& b, const std::string& what) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype() || !(a.sharding() == b.sharding())) {
    throw ValueError("optimizer: " + what + " does not match its parameter (" + a.shape().to_string() + " vs " +
                     b.shape().to_string() + ", " + a.sharding().to_string() + " vs " + b.sharding().to_string() + ")");
  }
}

const std::byte* block(const Array& a, int64_t device) { return a.shard(device).buffer.data(); }

// v with a new value, its kind, partitioning and metadata kept.
Variable with_value(const Variable& v, std::string kind, Array value) {
  Variable out(std::move(kind), std::move(value), v.partitioning());
  out.metadata() = v.metadata();
  return out;
}

// Each of `outs` moved on by `bytes`.
std::vector<std::byte*> shifted(const std::vector<std::byte*>& outs, int64_t bytes) {
  std::vector<std::byte*> out;
  for (std::byte* o : outs) out.push_back(o + bytes);
  return out;
}

// `count` new arrays on x's layout written together: fn(device, at, n, outs) writes elements
// [at, at + n) of each device's block of every array, outs[i] pointing at element at of array i
// (over the cores when the blocks are fewer than the cores; the arithmetic is elementwise, so the
// split does not change a bit). Parameters, their optimizer state and the reduced gradients hold
// equal replicas, so do the updates: one per distinct block, shared by the other replicas (data
// parallelism on one host would otherwise repeat the arithmetic once per device).
template <class Fn>
std::vector<Array> map_blocks(const Array& x, size_t count, Fn fn) {
  const auto item = static_cast<int64_t>(item_size(x.dtype()));
  return ops::detail::compute_blocks_once(
      x.runtime(), x.shape(), x.dtype(), x.sharding(), count,
      [&](int64_t device, const Box& box, const std::vector<std::byte*>& outs) {
        ops::detail::split_range(box.volume(), int64_t{1} << 14, [&](int64_t lo, int64_t hi) {
          fn(device, lo, hi - lo, shifted(outs, lo * item));
        });
      });
}

// One new array: fn(device, at, n, out).
template <class Fn>
Array map_blocks(const Array& x, Fn fn) {
  return std::move(map_blocks(x, 1, [&](int64_t device, int64_t at, int64_t n, const std::vector<std::byte*>& outs) {
    fn(device, at, n, outs[0]);
  })[0]);
}

template <class Fn>
void dispatch(DType dtype, const std::string& path, Fn&& fn) {
  if (dtype == DType::kF32) {
    fn(float{});
  } else if (dtype == DType::kF64) {
    fn(double{});
  } else {
    throw ValueError("optimizer: '" + path + "' is " + std::string(name(dtype)) +
                     "; training updates f32 or f64 parameters");
  }
}

}  // namespace

double Schedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (decay_steps <= 0) return peak;
  const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * t));
  return peak * (end_fraction + (1 - end_fraction) * cosine);
}

State init_optimizer(const OptimizerConfig& config, const State& params) {
  State out;
  const bool has_mu = config.kind == OptimizerKind::kAdamW || config.momentum != 0;
  const bool has_nu = config.kind == OptimizerKind::kAdamW;
  for (const auto& [path, v] : params) {
    auto zeros = [&, &path = path, &v = v](const std::string& at) {
      if (v.is_abstract()) {
        out.insert(at, Variable::abstract(kOptState, v.shape(), v.dtype(), v.sharding(), v.partitioning()));
        return;
      }
      const Array& p = v.array(path);
      Array z = map_blocks(p, [&](int64_t, int64_t, int64_t n, std::byte* o) {
        std::memset(o, 0, static_cast<size_t>(n) * item_size(p.dtype()));
      });
      out.insert(at, Variable(kOptState, std::move(z), v.partitioning()));
    };
    if (has_mu) zeros(mu_path(path));
    if (has_nu) zeros(nu_path(path));
  }
  return out;
}

namespace {

// The global norm's chunks: a block's sum of squares is its chunks' sums (fixed chunks, not one
// per core) added in order, so that a large block spreads over the cores (one device's gradients)
// with bits that do not depend on how many there are.
constexpr int64_t kNormChunk = int64_t{1} << 16;

int64_t chunks_of(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

// The sum of squares of n elements of a block, as one chunk of the norm.
double chunk_squares(DType dtype, const std::string& path, const std::byte* data, int64_t n) {
  double out = 0;
  dispatch(dtype, path, [&](auto zero) {
    using T = decltype(zero);
    const T* x = reinterpret_cast<const T*>(data);
    if constexpr (std::is_same_v<T, float>) {
      out = ops::detail::sum_squares_f32(x, n);
    } else {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += x[k] * x[k];
      out = sum;
    }
  });
  return out;
}

// One sum of squares per chunk of every block the global norm counts in this process (replica 0's,
// each distinct block once), added up as its definition says: a block's chunks in order, then the
// blocks in mesh order, arrays in path order, each block's sum taken from the one process that
// holds its replica 0. Filled by global_norm, or by an optimizer's update pass on the side.
class SquareSums {
 public:
  explicit SquareSums(const std::map<std::string, Array>& arrays) {
    for (const auto& [path, a] : arrays) {
      const size_t first_counted = counted_.size();
      for (const Shard& s : a.shards()) {
        const bool here = s.replica_id == 0 && s.is_addressable();
        if (here) counted_.push_back({&path, &a, &s, sums_.size()});
        blocks_.push_back({sums_.size(), here ? static_cast<size_t>(chunks_of(s.box.volume())) : 0});
        sums_.resize(sums_.size() + blocks_.back().chunks, 0.0);
      }
      // Any local replica of a counted block finds its sums (whichever replica an update writes).
      std::map<int64_t, size_t>& first = first_[path];
      for (const Shard& s : a.shards()) {
        for (size_t c = first_counted; c < counted_.size(); ++c)
          if (s.is_addressable() && counted_[c].shard->box == s.box) first[s.device] = counted_[c].at;
      }
    }
    if (!arrays.empty()) pool_ = &arrays.begin()->second.runtime().pool();
    if (!arrays.empty()) group_ = &arrays.begin()->second.runtime().processes();
  }

  // Every chunk's sum, over the cores (global_norm's own pass).
  void fill() {
    std::vector<std::pair<const Counted*, int64_t>> chunks;  // block, chunk
    for (const Counted& c : counted_)
      for (int64_t k = 0; k < chunks_of(c.shard->box.volume()); ++k) chunks.push_back({&c, k});
    if (chunks.empty()) return;
    pool_->parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t i) {
      const auto [c, k] = chunks[static_cast<size_t>(i)];
      const int64_t at = k * kNormChunk, n = std::min(kNormChunk, c->shard->box.volume() - at);
      const int64_t item = static_cast<int64_t>(item_size(c->array->dtype()));
      sums_[c->at + static_cast<size_t>(k)] = chunk_squares(c->array->dtype(), *c->path, c->shard->buffer.data() + at * item, n);
    });
  }

  // Where chunk `chunk` of the block of `path` on `device` goes, nullptr where the block is
  // counted on another process.
  double* at(const std::string& path, int64_t device, int64_t chunk) {
    const std::map<int64_t, size_t>& first = first_.at(path);
    const auto it = first.find(device);
    return it == first.end() ? nullptr : &sums_[it->second + static_cast<size_t>(chunk)];
  }

  double norm() const {
    std::vector<double> partial;  // one per block
    for (const Block& b : blocks_) {
      double sum = 0;
      for (size_t c = 0; c < b.chunks; ++c) sum += sums_[b.at + c];
      partial.push_back(sum);
    }
    // Across processes each partial is non-zero on the one process that holds its replica 0.
    if (group_ && group_->count() > 1) {
      const std::string mine(reinterpret_cast<const char*>(partial.data()), partial.size() * sizeof(double));
      std::vector<double> sum(partial.size(), 0.0);
      for (const std::string& theirs : group_->all_gather(mine, "the global gradient norm")) {
        if (theirs.size() != mine.size()) throw Error("the global gradient norm: the processes hold different gradients");
        for (size_t i = 0; i < sum.size(); ++i) {
          double v = 0;
          std::memcpy(&v, theirs.data() + i * sizeof(double), sizeof(double));
          sum[i] += v;
        }
      }
      partial = std::move(sum);
    }
    double total = 0;
    for (double p : partial) total += p;
    return std::sqrt(total);
  }

 private:
  struct Block {
    size_t at, chunks;  // its chunks' sums in sums_ (none when not counted here)
  };
  struct Counted {  // a block counted here: replica 0's, in this process
    const std::string* path;
    const Array* array;
    const Shard* shard;
    size_t at;  // its first chunk's sum
  };
  std::vector<Counted> counted_;
  WorkerPool* pool_ = nullptr;
  std::map<std::string, std::map<int64_t, size_t>> first_;  // path -> device -> its block's first chunk sum
  std::vector<Block> blocks_;                           // every array's shards, in order
  std::vector<double> sums_;
  ProcessGroup* group_ = nullptr;
};

// `count` new arrays on x's layout, as map_blocks writes them, in pieces of whole norm chunks (the
// last one short): fn(device, chunk, at, n, outs) for each chunk, elements [at, at + n).
template <class Fn>
std::vector<Array> map_chunks(const Array& x, size_t count, Fn fn) {
  const auto item = static_cast<int64_t>(item_size(x.dtype()));
  return ops::detail::compute_blocks_once(
      x.runtime(), x.shape(), x.dtype(), x.sharding(), count,
      [&](int64_t device, const Box& box, const std::vector<std::byte*>& outs) {
        const int64_t n = box.volume();
        ops::detail::split_range(chunks_of(n), 1, [&](int64_t lo, int64_t hi) {
          for (int64_t c = lo; c < hi; ++c) {
            const int64_t at = c * kNormChunk;
            fn(device, c, at, std::min(kNormChunk, n - at), shifted(outs, at * item));
          }
        });
      });
}

}  // namespace

double global_norm(const std::map<std::string, Array>& arrays) {
  if (arrays.empty()) return 0;
  SquareSums sums(arrays);
  sums.fill();
  return sums.norm();
}

UpdateStats apply_updates(const OptimizerConfig& c, int64_t step, State& params, State& opt_state,
                          const std::map<std::string, Array>& grads) {
  UpdateStats stats;
  stats.lr = c.schedule.at(step);
  if (params.empty() || params.begin()->second.is_abstract()) return stats;
  for (const auto& [path, v] : params) {
    if (!grads.contains(path)) throw ValueError("optimizer: no gradient for '" + path + "'");
  }
  // Without clipping the norm is only reported: its chunks' sums are taken in the update's own pass,
  // each chunk of a gradient while it is in cache, which saves a pass over the gradients (2% of
  // DotReluDot's step). The same chunks, the same bits as global_norm.
  const bool clips = c.clip_norm > 0;
  std::optional<SquareSums> sums;
  if (clips || grads.size() != params.size()) {
    stats.grad_norm = global_norm(grads);
  } else {
    sums.emplace(grads);
  }
  const double clip = clips && stats.grad_norm > c.clip_norm ? c.clip_norm / stats.grad_norm : 1.0;
  const double lr = stats.lr;
  const double t = static_cast<double>(step + 1);
  const double bc1 = 1 - std::pow(c.b1, t), bc2 = 1 - std::pow(c.b2, t);
  const bool adam = c.kind == OptimizerKind::kAdamW, momentum = !adam && c.momentum != 0;
  for (const auto& entry : params) {
    const std::string& path = entry.first;  // named, not bound: lambdas below capture it
    const Variable& v = entry.second;
    const Array& p = v.array(path);
    const Array& g = grads.at(path);
    check_same_layout(p, g, "the gradient of '" + path + "'");
    // The update's new arrays: fn(device, at, n, outs) over pieces of each block, the gradient's
    // chunks' sums of squares taken on the way when the norm is (see above).
    auto new_arrays = [&](size_t count, const auto& fn) {
      if (!sums) return map_blocks(p, count, fn);
      const int64_t item = static_cast<int64_t>(item_size(g.dtype()));
      return map_chunks(p, count, [&](int64_t d, int64_t chunk, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
        if (double* sum = sums->at(path, d, chunk)) *sum = chunk_squares(g.dtype(), path, block(g, d) + at * item, n);
        fn(d, at, n, o);
      });
    };
    dispatch(p.dtype(), path, [&](auto zero) {
      using T = decltype(zero);
      auto in = [](const Array& a, int64_t device, int64_t at) { return reinterpret_cast<const T*>(block(a, device)) + at; };
      if (adam) {
        const Array& mu = opt_state.at(mu_path(path)).array(mu_path(path));
        const Array& nu = opt_state.at(nu_path(path)).array(nu_path(path));
        check_same_layout(p, mu, mu_path(path));
        check_same_layout(p, nu, nu_path(path));
        // One pass: each element's moments and parameter from one read of its four inputs.
        std::vector<Array> next = new_arrays(3, [&](int64_t d, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
          const T *x = in(p, d, at), *gr = in(g, d, at), *m = in(mu, d, at), *s = in(nu, d, at);
          T *out = reinterpret_cast<T*>(o[0]), *m_out = reinterpret_cast<T*>(o[1]), *s_out = reinterpret_cast<T*>(o[2]);
          if constexpr (std::is_same_v<T, float>) {
            const detail::AdamF32 k{c.b1, (1 - c.b1) * clip, c.b2, 1 - c.b2, clip, lr, bc1, bc2, c.eps, c.weight_decay};
            return detail::adam_f32(k, x, gr, m, s, out, m_out, s_out, n);
          }
          for (int64_t i = 0; i < n; ++i) {
            const double gc = clip * gr[i];
            m_out[i] = static_cast<T>(c.b1 * m[i] + (1 - c.b1) * clip * gr[i]);
            s_out[i] = static_cast<T>(c.b2 * s[i] + (1 - c.b2) * gc * gc);
            const double update = (m_out[i] / bc1) / (std::sqrt(s_out[i] / bc2) + c.eps) + c.weight_decay * x[i];
            out[i] = static_cast<T>(x[i] - lr * update);
          }
        });
        Array p2 = std::move(next[0]), mu2 = std::move(next[1]), nu2 = std::move(next[2]);
        opt_state.replace(mu_path(path), with_value(opt_state.at(mu_path(path)), kOptState, std::move(mu2)));
        opt_state.replace(nu_path(path), with_value(opt_state.at(nu_path(path)), kOptState, std::move(nu2)));
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      } else if (momentum) {
        const Array& mu = opt_state.at(mu_path(path)).array(mu_path(path));
        check_same_layout(p, mu, mu_path(path));
        std::vector<Array> next = new_arrays(2, [&](int64_t d, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
          const T *x = in(p, d, at), *gr = in(g, d, at), *m = in(mu, d, at);
          T *out = reinterpret_cast<T*>(o[0]), *m_out = reinterpret_cast<T*>(o[1]);
          if constexpr (std::is_same_v<T, float>) return detail::sgd_momentum_f32(clip, c.momentum, lr, x, gr, m, out, m_out, n);
          for (int64_t i = 0; i < n; ++i) {
            m_out[i] = static_cast<T>(clip * gr[i] + c.momentum * m[i]);
            out[i] = static_cast<T>(x[i] - lr * m_out[i]);
          }
        });
        Array p2 = std::move(next[0]), mu2 = std::move(next[1]);
        opt_state.replace(mu_path(path), with_value(opt_state.at(mu_path(path)), kOptState, std::move(mu2)));
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      } else {
        Array p2 = std::move(new_arrays(1, [&](int64_t d, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
          const T *x = in(p, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o[0]);
          if constexpr (std::is_same_v<T, float>) return detail::sgd_f32(lr * clip, x, gr, out, n);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] - lr * clip * gr[i]);
        })[0]);
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      }
    });
  }
  if (sums) stats.grad_norm = sums->norm();
  return stats;
}

}  // namespace tessel::nn
