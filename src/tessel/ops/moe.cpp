#include "tessel/ops/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/collectives.h"

namespace tessel::ops {
namespace {

using namespace detail;

void check_int(const Tensor& t, const char* op, const char* what) {
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64)
    throw ValueError(fmt::format("{}: {} must be i32 or i64, not {}", op, what, t.to_string()));
  if (t.is_partial()) throw ValueError(fmt::format("{}: {} cannot be a partial sum: {}", op, what, t.to_string()));
}

int64_t int_at(const Tensor& t, int64_t device, int64_t i) {
  const std::byte* p = block(t, device);
  return t.dtype() == DType::kI32 ? reinterpret_cast<const int32_t*>(p)[i] : reinterpret_cast<const int64_t*>(p)[i];
}

[[noreturn]] void out_of_range(const char* op, int64_t id, int64_t n) {
  throw ValueError(fmt::format("{}: index {} is out of range [0, {})", op, id, n));
}

// x with its last dimension whole (its leading splits kept).
Tensor last_whole(const Tensor& x) {
  Dims d = dims_of(x.sharding(), x.rank());
  d.back() = {};
  return reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), d));
}

Tensor top_k_indices(const Tensor& x_in, int64_t k) {
  const Tensor x = last_whole(x_in);
  const int64_t n = x.shape()[x.rank() - 1];
  std::vector<int64_t> dims(x.shape().dims().begin(), x.shape().dims().end());
  dims.back() = k;
  return output(x, Shape(dims), DType::kI32, x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t rows = box.volume() / k;
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = reinterpret_cast<const T*>(block(x, device));
      auto* out = reinterpret_cast<int32_t*>(o);
      std::vector<int32_t> order(static_cast<size_t>(n));
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = in + r * n;
        // NaN ranks above everything, as in XLA's total order for sorting floats.
        auto key = [row](int32_t i) { return std::isnan(row[i]) ? std::numeric_limits<T>::infinity() : row[i]; };
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          const T ka = key(a), kb = key(b);
          return ka > kb || (ka == kb && a < b);
        });
        std::copy(order.begin(), order.begin() + k, out + r * k);
      }
    });
  });
}

// The gradient of take_along_last: g [..., k] added at the indices of [..., n].
Tensor scatter_along_last(const Tensor& g_in, const Tensor& indices, const Shape& shape) {
  const Tensor g = reshard_raw(reduce_raw(g_in, nullptr), indices.sharding());
  const int64_t n = shape[shape.rank() - 1], k = indices.shape()[indices.rank() - 1];
  return output(g, shape, g.dtype(), indices.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t rows = box.volume() / n;
    dispatch_float(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* src = reinterpret_cast<const T*>(block(g, device));
      T* out = reinterpret_cast<T*>(o);
      std::fill(out, out + rows * n, T(0));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < k; ++j) out[r * n + int_at(indices, device, r * k + j)] += src[r * k + j];
    });
  });
}

// --- dispatch and combine. The routing's tensors are split as (batch axes, -, -).
DimSharding batch_axes(const Routing& r) { return dims_of(r.indices.sharding(), 3)[0]; }

void check_routing(const Routing& r, const Shape& tokens, const char* op) {
  if (!r.indices.defined() || !r.slots.defined() || r.capacity < 1)
    throw ValueError(fmt::format("{}: the routing is empty (make it with ops::route)", op));
  if (r.indices.shape()[0] != tokens[0] || r.indices.shape()[1] != tokens[1])
    throw ValueError(fmt::format("{}: the routing is for [batch, seq] = [{}, {}], the tokens are {}", op,
                                 r.indices.shape()[0], r.indices.shape()[1], tokens.to_string()));
}

// fn(at, token, row) for each choice of the device's nb batch rows: `at` its index in the routing's
// block, `token` its token's row in a [nb * seq] block, `row` its row in a [experts, nb, capacity]
// buffer block, -1 when dropped.
template <class Fn>
void for_each_choice(const Routing& r, int64_t device, int64_t nb, Fn&& fn) {
  const int64_t seq = r.indices.shape()[1], k = r.indices.shape()[2];
  for (int64_t t = 0; t < nb * seq; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = t * k + j, slot = int_at(r.slots, device, at);
      const int64_t row = slot < 0 ? -1 : (int_at(r.indices, device, at) * nb + t / seq) * r.capacity + slot;
      fn(at, t, row);
    }
}

// x [b, s, emb] on (batch, -, emb axes) -> buffer [experts, b, capacity, emb] on (-, batch, -, emb
// axes); each kept choice's row times its weight when `weights` is given.
Tensor dispatch_raw(const Tensor& x, const Routing& r, const Tensor& weights) {
  const Dims xd = dims_of(x.sharding(), 3);
  const Shape shape{r.num_experts, x.shape()[0], r.capacity, x.shape()[2]};
  const Tensor w = weights.defined() ? reshard_raw(reduce_raw(weights, nullptr), r.indices.sharding()) : Tensor();
  return output(x, shape, x.dtype(), with_dims(x.mesh(), {{}, xd[0], {}, xd[2]}), {},
                [&](int64_t device, const Box& box, std::byte* o) {
                  const int64_t nb = box.extent(1), ne = box.extent(3);
                  dispatch_float(x.dtype(), [&](auto zero) {
                    using T = decltype(zero);
                    const T* in = reinterpret_cast<const T*>(block(x, device));
                    const T* wv = w.defined() ? reinterpret_cast<const T*>(block(w, device)) : nullptr;
                    T* out = reinterpret_cast<T*>(o);
                    std::fill(out, out + box.volume(), T(0));
                    for_each_choice(r, device, nb, [&](int64_t at, int64_t token, int64_t row) {
                      if (row < 0) return;
                      const T f = wv ? wv[at] : T(1);
                      for (int64_t i = 0; i < ne; ++i) out[row * ne + i] = in[token * ne + i] * f;
                    });
                  });
                });
}

// The buffer on (-, batch, -, emb axes not used by the batch).
Tensor buffer_for(const Tensor& buffer_in, const Routing& r) {
  const Tensor b = reduce_raw(buffer_in, nullptr);
  const Dims bd = dims_of(b.sharding(), 4);
  return reshard_raw(b, with_dims(b.mesh(), {{}, batch_axes(r), {}, minus(bd[3], batch_axes(r))}));
}

// buffer (from buffer_for) -> [b, s, emb] on (batch, -, emb axes): each token's kept choices
// summed, times their weights when given.
Tensor combine_raw(const Tensor& buf, const Tensor& weights, const Routing& r) {
  const Dims bd = dims_of(buf.sharding(), 4);
  const Shape shape{buf.shape()[1], r.indices.shape()[1], buf.shape()[3]};
  const Tensor w = weights.defined() ? reshard_raw(reduce_raw(weights, nullptr), r.indices.sharding()) : Tensor();
  return output(buf, shape, buf.dtype(), with_dims(buf.mesh(), {bd[1], {}, bd[3]}), {},
                [&](int64_t device, const Box& box, std::byte* o) {
                  const int64_t nb = box.extent(0), ne = box.extent(2);
                  dispatch_float(buf.dtype(), [&](auto zero) {
                    using T = decltype(zero);
                    const T* in = reinterpret_cast<const T*>(block(buf, device));
                    const T* wv = w.defined() ? reinterpret_cast<const T*>(block(w, device)) : nullptr;
                    T* out = reinterpret_cast<T*>(o);
                    std::fill(out, out + box.volume(), T(0));
                    for_each_choice(r, device, nb, [&](int64_t at, int64_t token, int64_t row) {
                      if (row < 0) return;
                      const T f = wv ? wv[at] : T(1);
                      for (int64_t i = 0; i < ne; ++i) out[token * ne + i] += in[row * ne + i] * f;
                    });
                  });
                });
}

// d combine / d weights: [b, s, k], each kept choice's g row . buffer row; a partial sum over the
// axes splitting emb.
Tensor weights_grad(const Tensor& g, const Tensor& buf, const Routing& r) {
  const Dims bd = dims_of(buf.sharding(), 4);
  Axes partial = bd[3];
  std::sort(partial.begin(), partial.end());
  return output(buf, r.indices.shape(), buf.dtype(), r.indices.sharding(), partial,
                [&](int64_t device, const Box& box, std::byte* o) {
                  const int64_t nb = box.extent(0), ne = block_box(buf, device).extent(3);
                  dispatch_float(buf.dtype(), [&](auto zero) {
                    using T = decltype(zero);
                    const T* bv = reinterpret_cast<const T*>(block(buf, device));
                    const T* gv = reinterpret_cast<const T*>(block(g, device));
                    T* out = reinterpret_cast<T*>(o);
                    for_each_choice(r, device, nb, [&](int64_t at, int64_t token, int64_t row) {
                      T dot = 0;
                      for (int64_t i = 0; row >= 0 && i < ne; ++i) dot += bv[row * ne + i] * gv[token * ne + i];
                      out[at] = dot;
                    });
                  });
                });
}

// The sharding all_to_all gives: `axes` off concat_dim's split (its minor axes), onto split_dim's.
NamedSharding all_to_all_sharding(const Tensor& x, const std::vector<std::string>& axes, size_t split_dim,
                                  size_t concat_dim) {
  Dims d = dims_of(x.sharding(), x.rank());
  DimSharding& from = d[concat_dim];
  if (from.size() < axes.size() || !std::equal(axes.begin(), axes.end(), from.end() - static_cast<ptrdiff_t>(axes.size())))
    throw ShardingError(fmt::format("all_to_all: dimension {} of {} is not split over ({}) as its minor axes",
                                    concat_dim, x.to_string(), fmt::join(axes, ", ")));
  from.resize(from.size() - axes.size());
  d[split_dim].insert(d[split_dim].end(), axes.begin(), axes.end());
  return with_dims(x.mesh(), d);
}

}  // namespace

TopK top_k(const Tensor& x, int64_t k) {
  check_float(x, "top_k");
  if (x.rank() < 1) throw ValueError("top_k: needs at least one dimension, got " + x.to_string());
  const int64_t n = x.shape()[x.rank() - 1];
  if (k < 1 || k > n) throw ValueError(fmt::format("top_k: k = {} is not in [1, {}] for {}", k, n, x.to_string()));
  const Tensor indices = top_k_indices(x, k);
  return {take_along_last(x, indices), indices};
}

Tensor take_along_last(const Tensor& x_in, const Tensor& indices_in) {
  check_float(x_in, "take_along_last");
  check_int(indices_in, "take_along_last", "indices");
  const size_t r = x_in.rank();
  if (r < 1 || indices_in.rank() != r ||
      !std::equal(x_in.shape().dims().begin(), x_in.shape().dims().end() - 1, indices_in.shape().dims().begin()))
    throw ValueError("take_along_last: indices " + indices_in.to_string() + " do not match the leading dimensions of " +
                     x_in.to_string());
  if (!(x_in.mesh() == indices_in.mesh())) throw ShardingError("take_along_last: x and indices live on different meshes");
  const Tensor x = last_whole(x_in);
  const Tensor indices = reshard_raw(indices_in, x.sharding());
  const int64_t n = x.shape()[r - 1], k = indices.shape()[r - 1];
  Tensor out = output(x, indices.shape(), x.dtype(), x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t rows = box.volume() / k;
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = reinterpret_cast<const T*>(block(x, device));
      T* dst = reinterpret_cast<T*>(o);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t i = int_at(indices, device, row * k + j);
          if (i < 0 || i >= n) out_of_range("take_along_last", i, n);
          dst[row * k + j] = in[row * n + i];
        }
    });
  });
  return record(out, {x_in}, [indices, shape = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{scatter_along_last(g, indices, shape)};
  });
}

Tensor choice_counts(const Tensor& indices_in, const Tensor& like_in) {
  check_int(indices_in, "choice_counts", "indices");
  check_float(like_in, "choice_counts");
  const size_t r = like_in.rank();
  if (r < 1 || indices_in.rank() != r ||
      !std::equal(like_in.shape().dims().begin(), like_in.shape().dims().end() - 1, indices_in.shape().dims().begin()))
    throw ValueError("choice_counts: indices " + indices_in.to_string() + " do not match the leading dimensions of " +
                     like_in.to_string());
  Dims d = dims_of(like_in.sharding(), r);
  d.back() = {};
  const NamedSharding sharding = with_dims(like_in.mesh(), d);
  const Tensor indices = reshard_raw(indices_in, sharding);
  const int64_t n = like_in.shape()[r - 1], k = indices.shape()[r - 1];
  return output(indices, like_in.shape(), like_in.dtype(), sharding, {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t rows = box.volume() / n;
    dispatch_float(like_in.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* out = reinterpret_cast<T*>(o);
      std::fill(out, out + rows * n, T(0));
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t i = int_at(indices, device, row * k + j);
          if (i < 0 || i >= n) out_of_range("choice_counts", i, n);
          out[row * n + i] += T(1);
        }
    });
  });
}

Routing route(const Tensor& indices_in, int64_t num_experts, int64_t capacity) {
  check_int(indices_in, "route", "the expert indices");
  if (indices_in.rank() != 3)
    throw ValueError("route: the expert indices must be [batch, seq, k], got " + indices_in.to_string());
  if (num_experts < 1) throw ValueError(fmt::format("route: num_experts must be positive, got {}", num_experts));
  const Dims d = dims_of(indices_in.sharding(), 3);
  Routing r;
  r.num_experts = num_experts;
  r.indices = reshard_raw(indices_in, with_dims(indices_in.mesh(), {d[0], {}, {}}));
  const int64_t seq = r.indices.shape()[1], k = r.indices.shape()[2];
  const bool dropless = capacity <= 0;
  r.slots = output(r.indices, r.indices.shape(), DType::kI32, r.indices.sharding(), {},
                   [&](int64_t device, const Box& box, std::byte* o) {
                     auto* out = reinterpret_cast<int32_t*>(o);
                     std::vector<int64_t> count(static_cast<size_t>(num_experts));
                     for (int64_t b = 0; b < box.extent(0); ++b) {
                       std::fill(count.begin(), count.end(), 0);
                       for (int64_t i = 0; i < seq * k; ++i) {
                         const int64_t at = b * seq * k + i, e = int_at(r.indices, device, at);
                         if (e < 0 || e >= num_experts) out_of_range("route", e, num_experts);
                         const int64_t slot = count[static_cast<size_t>(e)]++;
                         out[at] = !dropless && slot >= capacity ? -1 : static_cast<int32_t>(slot);
                       }
                     }
                   });
  if (!dropless) {
    r.capacity = capacity;
  } else if (r.indices.is_abstract()) {
    r.capacity = std::max<int64_t>(1, seq * k);  // the most a row can route to one expert
  } else {
    // The fullest buffer over the whole batch: each device's largest slot, then the maximum over
    // every device (the same capacity everywhere, so the buffers form one global array).
    const Tensor& slots = r.slots;
    const Mesh& mesh = slots.mesh();
    Array fullest = make_array_from_device_callback(
        slots.shards().runtime(), Shape{1}, DType::kF32, NamedSharding(mesh, {}),
        [&](int64_t device, const Box&, std::span<std::byte> out) {
          const int64_t n = block_box(slots, device).volume();
          const auto* s = reinterpret_cast<const int32_t*>(block(slots, device));
          int32_t top = -1;
          for (int64_t i = 0; i < n; ++i) top = std::max(top, s[i]);
          *reinterpret_cast<float*>(out.data()) = static_cast<float>(top + 1);
        });
    std::vector<std::string> axes;
    for (const MeshAxis& a : mesh.axes()) axes.push_back(a.name);
    fullest = all_reduce(fullest, axes, Reduction::kMax);
    const HostArray top = to_host(fullest);
    r.capacity = std::max<int64_t>(1, static_cast<int64_t>(top.values<float>()[0]));
  }
  return r;
}

Tensor moe_dispatch(const Tensor& x_in, const Routing& r) {
  check_float(x_in, "moe_dispatch");
  if (x_in.rank() != 3) throw ValueError("moe_dispatch: tokens must be [batch, seq, emb], got " + x_in.to_string());
  check_routing(r, x_in.shape(), "moe_dispatch");
  const Tensor x0 = reduce_raw(x_in, nullptr);
  const Dims xd = dims_of(x0.sharding(), 3);
  const Tensor x = reshard_raw(x0, with_dims(x0.mesh(), {batch_axes(r), {}, minus(xd[2], batch_axes(r))}));
  return record(dispatch_raw(x, r, Tensor()), {x_in}, [r](const Tensor& g) {
    return std::vector<Tensor>{combine_raw(buffer_for(g, r), Tensor(), r)};
  });
}

Tensor moe_combine(const Tensor& buffer_in, const Tensor& weights, const Routing& r) {
  check_operands(buffer_in, weights, "moe_combine");
  if (buffer_in.rank() != 4 || buffer_in.shape()[0] != r.num_experts || buffer_in.shape()[2] != r.capacity)
    throw ValueError(fmt::format("moe_combine: the buffer must be [experts = {}, batch, capacity = {}, emb], got {}",
                                 r.num_experts, r.capacity, buffer_in.to_string()));
  check_routing(r, Shape{buffer_in.shape()[1], r.indices.shape()[1]}, "moe_combine");
  if (weights.shape() != r.indices.shape())
    throw ValueError(fmt::format("moe_combine: the weights {} do not match the routing's {}", weights.to_string(),
                                 r.indices.to_string()));
  const Tensor buf = buffer_for(buffer_in, r);
  Tensor out = combine_raw(buf, weights, r);
  return record(out, {buffer_in, weights},
                [buf, w = stop_gradient(weights), r, nb = needs(buffer_in), nw = needs(weights)](const Tensor& g_in) {
                  const Dims bd = dims_of(buf.sharding(), 4);
                  const Tensor g = reshard_raw(reduce_raw(g_in, nullptr), with_dims(buf.mesh(), {bd[1], {}, bd[3]}));
                  return std::vector<Tensor>{nb ? dispatch_raw(g, r, w) : Tensor(),
                                             nw ? weights_grad(g, buf, r) : Tensor()};
                });
}

namespace {

bool ends_with(const DimSharding& axes, const DimSharding& tail) {
  return !tail.empty() && axes.size() >= tail.size() &&
         std::equal(tail.begin(), tail.end(), axes.end() - static_cast<ptrdiff_t>(tail.size()));
}

// Whether dimensions `a` and `b` of x split evenly over all of `axes_a` and `axes_b`: an
// all_to_all between them then moves whole blocks.
bool even(const Tensor& x, size_t a, const DimSharding& axes_a, size_t b, const DimSharding& axes_b) {
  return x.shape()[a] % blocks_of(x.mesh(), axes_a) == 0 && x.shape()[b] % blocks_of(x.mesh(), axes_b) == 0;
}

}  // namespace

Tensor to_experts(const Tensor& buffer_in, const Tensor& kernel) {
  if (buffer_in.rank() < 2 || kernel.rank() < 1 || buffer_in.shape()[0] != kernel.shape()[0])
    throw ValueError("to_experts: " + buffer_in.to_string() + " and the kernel " + kernel.to_string() +
                     " do not have the same experts");
  const Tensor buffer = reduce(buffer_in);
  const DimSharding experts = dims_of(kernel.sharding(), kernel.rank())[0];
  Dims d = dims_of(buffer.sharding(), buffer.rank());
  if (ends_with(d[1], experts) && d[0].empty() && even(buffer, 0, experts, 1, d[1]))
    return all_to_all(buffer, experts, 0, 1);
  for (size_t i = 1; i < d.size(); ++i) d[i] = minus(d[i], experts);
  d[0] = experts;
  return reshard(buffer, with_dims(buffer.mesh(), d));
}

Tensor from_experts(const Tensor& buffer_in, const Routing& r) {
  const Tensor buffer = reduce(buffer_in);
  if (buffer.rank() != 4) return buffer;
  const Dims d = dims_of(buffer.sharding(), 4);
  const DimSharding batch = batch_axes(r);
  if (!ends_with(batch, d[0])) return buffer;
  // As to_experts left it: the batch split without the expert axes, which the experts hold.
  const DimSharding rest(batch.begin(), batch.end() - static_cast<ptrdiff_t>(d[0].size()));
  if (d[1] != rest || !even(buffer, 0, d[0], 1, batch)) return buffer;
  return all_to_all(buffer, d[0], 1, 0);
}

Tensor all_to_all(const Tensor& x_in, const std::vector<std::string>& axes, size_t split_dim, size_t concat_dim) {
  if (split_dim >= x_in.rank() || concat_dim >= x_in.rank())
    throw ValueError(fmt::format("all_to_all: dimensions {} and {} of {}", split_dim, concat_dim, x_in.to_string()));
  const Tensor x = reduce_raw(x_in, nullptr);
  const NamedSharding target = all_to_all_sharding(x, axes, split_dim, concat_dim);
  Tensor out = x.is_abstract() ? Tensor::abstract(x.shape(), x.dtype(), target)
                               : Tensor(tessel::all_to_all(x.array(), axes, split_dim, concat_dim));
  return record(out, {x_in}, [axes, split_dim, concat_dim, target](const Tensor& g) {
    return std::vector<Tensor>{all_to_all(reshard_raw(reduce_raw(g, nullptr), target), axes, concat_dim, split_dim)};
  });
}

}  // namespace tessel::ops
