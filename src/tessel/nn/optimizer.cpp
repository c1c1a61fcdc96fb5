#include "tessel/nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
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
          std::vector<std::byte*> at;
          for (std::byte* o : outs) at.push_back(o + lo * item);
          fn(device, lo, hi - lo, at);
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

double global_norm(const std::map<std::string, Array>& arrays) {
  if (arrays.empty()) return 0;
  // One partial sum per shard (replica 0 only), added in shard order: the same bits whichever
  // process computed which partial. A shard's partial is its chunks' sums of squares (fixed
  // chunks, not one per core) added in order, so that a large shard spreads over the cores (one
  // device's gradients) with bits that do not depend on how many there are.
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<double> partial;
  for (const auto& entry : arrays) {
    const std::string& path = entry.first;  // named, not bound: lambdas below capture it
    const Array& a = entry.second;
    const std::span<const Shard> shards = a.shards();
    struct Chunk {
      size_t shard;
      int64_t lo, hi;
    };
    std::vector<Chunk> chunks;
    for (size_t i = 0; i < shards.size(); ++i) {
      if (shards[i].replica_id != 0 || !shards[i].is_addressable()) continue;
      const int64_t n = shards[i].box.volume();
      for (int64_t lo = 0; lo < n; lo += kChunk) chunks.push_back({i, lo, std::min(n, lo + kChunk)});
    }
    std::vector<double> sums(chunks.size(), 0.0);
    a.runtime().pool().parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      double& out = sums[static_cast<size_t>(c)];
      dispatch(a.dtype(), path, [&](auto zero) {
        using T = decltype(zero);
        const T* x = reinterpret_cast<const T*>(shards[ch.shard].buffer.data()) + ch.lo;
        if constexpr (std::is_same_v<T, float>) {
          out = ops::detail::sum_squares_f32(x, ch.hi - ch.lo);
        } else {
          double sum = 0;
          for (int64_t k = 0; k < ch.hi - ch.lo; ++k) sum += x[k] * x[k];
          out = sum;
        }
      });
    });
    const size_t at = partial.size();
    partial.resize(at + shards.size(), 0.0);
    for (size_t c = 0; c < chunks.size(); ++c) partial[at + chunks[c].shard] += sums[c];
  }
  // Across processes each partial is non-zero on the one process that holds its replica 0.
  ProcessGroup& group = arrays.begin()->second.runtime().processes();
  if (group.count() > 1) {
    const std::string mine(reinterpret_cast<const char*>(partial.data()), partial.size() * sizeof(double));
    std::vector<double> sum(partial.size(), 0.0);
    for (const std::string& theirs : group.all_gather(mine, "the global gradient norm")) {
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

UpdateStats apply_updates(const OptimizerConfig& c, int64_t step, State& params, State& opt_state,
                          const std::map<std::string, Array>& grads) {
  UpdateStats stats;
  stats.lr = c.schedule.at(step);
  if (params.empty() || params.begin()->second.is_abstract()) return stats;
  for (const auto& [path, v] : params) {
    if (!grads.contains(path)) throw ValueError("optimizer: no gradient for '" + path + "'");
  }
  stats.grad_norm = global_norm(grads);
  const double clip = c.clip_norm > 0 && stats.grad_norm > c.clip_norm ? c.clip_norm / stats.grad_norm : 1.0;
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
    dispatch(p.dtype(), path, [&](auto zero) {
      using T = decltype(zero);
      auto in = [](const Array& a, int64_t device, int64_t at) { return reinterpret_cast<const T*>(block(a, device)) + at; };
      if (adam) {
        const Array& mu = opt_state.at(mu_path(path)).array(mu_path(path));
        const Array& nu = opt_state.at(nu_path(path)).array(nu_path(path));
        check_same_layout(p, mu, mu_path(path));
        check_same_layout(p, nu, nu_path(path));
        // One pass: each element's moments and parameter from one read of its four inputs.
        std::vector<Array> next = map_blocks(p, 3, [&](int64_t d, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
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
        std::vector<Array> next = map_blocks(p, 2, [&](int64_t d, int64_t at, int64_t n, const std::vector<std::byte*>& o) {
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
        Array p2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *x = in(p, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o);
          if constexpr (std::is_same_v<T, float>) return detail::sgd_f32(lr * clip, x, gr, out, n);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] - lr * clip * gr[i]);
        });
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      }
    });
  }
  return stats;
}

}  // namespace tessel::nn
