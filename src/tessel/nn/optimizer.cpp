#include "tessel/nn/optimizer.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/nn/detail/adam_kernels.h"
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

// A new array on x's layout, each device's block written by fn(device, at, count, out) in
// element ranges [at, at + count) (over the cores when the blocks are fewer than the cores; the
// arithmetic is elementwise, so the split does not change a bit). `out` points at element at.
template <class Fn>
Array map_blocks(const Array& x, Fn fn) {
  // Parameters, their optimizer state and the reduced gradients hold equal replicas, so do the
  // updates: one per distinct block, shared by the other replicas (data parallelism on one host
  // would otherwise repeat the arithmetic once per device).
  const auto item = static_cast<int64_t>(item_size(x.dtype()));
  return ops::detail::compute_blocks_once(
      x.runtime(), x.shape(), x.dtype(), x.sharding(), [&](int64_t device, const Box& box, std::byte* out) {
        ops::detail::split_range(box.volume(), int64_t{1} << 14,
                                 [&](int64_t lo, int64_t hi) { fn(device, lo, hi - lo, out + lo * item); });
      });
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
  // process computed which partial.
  std::vector<double> partial;
  for (const auto& entry : arrays) {
    const std::string& path = entry.first;  // named, not bound: lambdas below capture it
    const Array& a = entry.second;
    const std::span<const Shard> shards = a.shards();
    const size_t at = partial.size();
    partial.resize(at + shards.size(), 0.0);
    a.runtime().pool().parallel_for(static_cast<int64_t>(shards.size()), [&](int64_t i) {
      const Shard& s = shards[static_cast<size_t>(i)];
      if (s.replica_id != 0 || !s.is_addressable()) return;
      const int64_t n = s.box.volume();
      double& out = partial[at + static_cast<size_t>(i)];
      dispatch(a.dtype(), path, [&](auto zero) {
        using T = decltype(zero);
        const T* x = reinterpret_cast<const T*>(s.buffer.data());
        if constexpr (std::is_same_v<T, float>) {
          out = ops::detail::sum_squares_f32(x, n);
        } else {
          double sum = 0;
          for (int64_t k = 0; k < n; ++k) sum += x[k] * x[k];
          out = sum;
        }
      });
    });
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
        constexpr bool f32 = std::is_same_v<T, float>;
        Array mu2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *m = in(mu, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o);
          if constexpr (f32) return detail::adam_mu_f32(c.b1, (1 - c.b1) * clip, m, gr, out, n);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(c.b1 * m[i] + (1 - c.b1) * clip * gr[i]);
        });
        Array nu2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *m = in(nu, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o);
          if constexpr (f32) return detail::adam_nu_f32(c.b2, 1 - c.b2, clip, m, gr, out, n);
          for (int64_t i = 0; i < n; ++i) {
            const double gc = clip * gr[i];
            out[i] = static_cast<T>(c.b2 * m[i] + (1 - c.b2) * gc * gc);
          }
        });
        Array p2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *x = in(p, d, at), *m = in(mu2, d, at), *s = in(nu2, d, at);
          T* out = reinterpret_cast<T*>(o);
          if constexpr (f32) return detail::adam_param_f32(lr, bc1, bc2, c.eps, c.weight_decay, x, m, s, out, n);
          for (int64_t i = 0; i < n; ++i) {
            const double update = (m[i] / bc1) / (std::sqrt(s[i] / bc2) + c.eps) + c.weight_decay * x[i];
            out[i] = static_cast<T>(x[i] - lr * update);
          }
        });
        opt_state.replace(mu_path(path), with_value(opt_state.at(mu_path(path)), kOptState, std::move(mu2)));
        opt_state.replace(nu_path(path), with_value(opt_state.at(nu_path(path)), kOptState, std::move(nu2)));
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      } else if (momentum) {
        const Array& mu = opt_state.at(mu_path(path)).array(mu_path(path));
        check_same_layout(p, mu, mu_path(path));
        Array mu2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *m = in(mu, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(clip * gr[i] + c.momentum * m[i]);
        });
        Array p2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *x = in(p, d, at), *m = in(mu2, d, at);
          T* out = reinterpret_cast<T*>(o);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] - lr * m[i]);
        });
        opt_state.replace(mu_path(path), with_value(opt_state.at(mu_path(path)), kOptState, std::move(mu2)));
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      } else {
        Array p2 = map_blocks(p, [&](int64_t d, int64_t at, int64_t n, std::byte* o) {
          const T *x = in(p, d, at), *gr = in(g, d, at);
          T* out = reinterpret_cast<T*>(o);
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] - lr * clip * gr[i]);
        });
        params.replace(path, with_value(v, v.kind(), std::move(p2)));
      }
    });
  }
  return stats;
}

}  // namespace tessel::nn
