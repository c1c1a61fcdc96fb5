#include "tessel/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <utility>

#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
#include "tessel/ops/detail/norm_kernels.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rows.h"
#include "tessel/ops/detail/softmax_kernels.h"
#include "tessel/ops/detail/vmath.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/reshard.h"

namespace tessel::ops {
namespace {

using namespace detail;

// --- elementwise
Shape broadcast_shape(const Shape& a, const Shape& b, const char* op) {
  const size_t r = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t x = i < r - a.rank() ? 1 : a[i - (r - a.rank())];
    const int64_t y = i < r - b.rank() ? 1 : b[i - (r - b.rank())];
    if (x != y && x != 1 && y != 1) {
      throw ValueError(std::string(op) + ": shapes " + a.to_string() + " and " + b.to_string() + " do not broadcast");
    }
    out[i] = x == 1 ? y : x;
  }
  return Shape(out);
}

// x's dims as they must be for an output with `out` dims: broadcast dimensions unsplit.
Dims operand_dims(const Shape& x, const Shape& shape, const Dims& out) {
  const size_t off = shape.rank() - x.rank();
  Dims d(x.rank());
  for (size_t i = 0; i < x.rank(); ++i) d[i] = x[i] == shape[i + off] ? out[i + off] : DimSharding{};
  return d;
}

template <class T, class Fn>
void broadcast_loop(const Box& box, const Box& ab, const Shape& as, const Box& bb, const Shape& bs, const T* a,
                    const T* b, T* out, Fn fn) {
  const size_t r = box.rank();
  std::vector<int64_t> sa(r, 0), sb(r, 0), ext(r);
  auto strides = [&](const Box& xb, const Shape& xs, std::vector<int64_t>& s) {
    const size_t off = r - xs.rank();
    int64_t stride = 1;
    for (size_t i = xs.rank(); i-- > 0;) {
      s[i + off] = xs[i] == 1 && box.extent(i + off) != 1 ? 0 : stride;
      stride *= xb.extent(i);
    }
  };
  strides(ab, as, sa);
  strides(bb, bs, sb);
  for (size_t i = 0; i < r; ++i) ext[i] = box.extent(i);
  if (box.volume() == 0) return;
  if (r == 0) {
    out[0] = fn(a[0], b[0]);
    return;
  }
  const int64_t inner = ext[r - 1], ia = sa[r - 1], ib = sb[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t oa = 0, ob = 0, oo = 0;
  for (;;) {
    // The common strides get loops the compiler can vectorize.
    if (ia == 1 && ib == 1) {
      for (int64_t j = 0; j < inner; ++j) out[oo + j] = fn(a[oa + j], b[ob + j]);
    } else if (ia == 1 && ib == 0) {
      const T y = b[ob];
      for (int64_t j = 0; j < inner; ++j) out[oo + j] = fn(a[oa + j], y);
    } else if (ia == 0 && ib == 1) {
      const T x = a[oa];
      for (int64_t j = 0; j < inner; ++j) out[oo + j] = fn(x, b[ob + j]);
    } else {
      for (int64_t j = 0; j < inner; ++j) out[oo + j] = fn(a[oa + j * ia], b[ob + j * ib]);
    }
    oo += inner;
    size_t d = r - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < ext[d]) break;
      oa -= sa[d] * ext[d];
      ob -= sb[d] * ext[d];
      idx[d] = 0;
    }
  }
}

// The *Grad cases take the forward input (or output, where noted) as a and the gradient as b.
enum class Binary { kFirst, kAdd, kSub, kMul, kDiv, kReluGrad, kTanhGrad, kGeluGrad, kSiluGrad, kRsqrtGrad, kSigmoidGrad, kEqMask };

// gelu's tanh approximation (Flax's nn.gelu default) and its derivative.
template <class T>
T gelu_of(T x) {
  const T c = T(0.7978845608028654), k = T(0.044715);
  return T(0.5) * x * (T(1) + std::tanh(c * (x + k * x * x * x)));
}
template <class T>
T gelu_grad_of(T x) {
  const T c = T(0.7978845608028654), k = T(0.044715);
  const T t = std::tanh(c * (x + k * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * c * (T(1) + T(3) * k * x * x);
}
template <class T>
T sigmoid_of(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void run_binary(Binary op, const Box& box, const Box& ab, const Shape& as, const Box& bb, const Shape& bs,
                const std::byte* a, const std::byte* b, std::byte* out) {
  auto* pa = reinterpret_cast<const T*>(a);
  auto* pb = reinterpret_cast<const T*>(b);
  auto* po = reinterpret_cast<T*>(out);
  switch (op) {
    case Binary::kFirst: return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T) { return x; });
    case Binary::kAdd: return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T y) { return x + y; });
    case Binary::kSub: return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T y) { return x - y; });
    case Binary::kMul: return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T y) { return x * y; });
    case Binary::kDiv: return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T y) { return x / y; });
    case Binary::kReluGrad:
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T g) { return x > T(0) ? g : T(0); });
    case Binary::kTanhGrad:  // a: the output
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T y, T g) { return g * (T(1) - y * y); });
    case Binary::kGeluGrad:
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T g) { return g * gelu_grad_of(x); });
    case Binary::kSiluGrad:
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T g) {
        const T s = sigmoid_of(x);
        return g * s * (T(1) + x * (T(1) - s));
      });
    case Binary::kRsqrtGrad:  // a: the output
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T y, T g) { return T(-0.5) * g * y * y * y; });
    case Binary::kSigmoidGrad:  // a: the output
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T y, T g) { return g * y * (T(1) - y); });
    case Binary::kEqMask:
      return broadcast_loop<T>(box, ab, as, bb, bs, pa, pb, po, [](T x, T m) { return x == m ? T(1) : T(0); });
  }
}

// An operand's step between slices of the output's first dimension: 0 where it broadcasts there.
int64_t leading_stride(size_t rank, const Box& xb, const Shape& xs) {
  if (xs.rank() < rank || xs[0] == 1) return 0;
  return xb.extent(0) == 0 ? 0 : xb.volume() / xb.extent(0);
}

// A broadcasting op's block in slices of its first dimension, split over the cores (one block on
// one device would otherwise take one core).
void broadcast_split(Binary op, DType dtype, const Box& box, const Box& ab, const Shape& as, const Box& bb,
                     const Shape& bs, const std::byte* a, const std::byte* b, std::byte* o) {
  const size_t r = box.rank();
  const int64_t rows = r == 0 ? 1 : box.extent(0);
  const int64_t per_row = rows == 0 ? 0 : box.volume() / rows;
  const int64_t item = static_cast<int64_t>(item_size(dtype));
  const int64_t step_a = r == 0 ? 0 : leading_stride(r, ab, as) * item;
  const int64_t step_b = r == 0 ? 0 : leading_stride(r, bb, bs) * item;
  detail::split_rows(rows, per_row, [&](int64_t lo, int64_t hi) {
    Box part = box;
    if (r > 0 && (lo > 0 || hi < rows)) {
      std::vector<int64_t> start(box.starts().begin(), box.starts().end()), stop(box.stops().begin(), box.stops().end());
      start[0] = box.start(0) + lo;
      stop[0] = box.start(0) + hi;
      part = Box(std::move(start), std::move(stop));
    }
    const std::byte *pa = a + lo * step_a, *pb = b + lo * step_b;
    std::byte* po = o + lo * per_row * item;
    if (dtype == DType::kF32) {
      run_binary<float>(op, part, ab, as, bb, bs, pa, pb, po);
    } else {
      run_binary<double>(op, part, ab, as, bb, bs, pa, pb, po);
    }
  });
}

Tensor binary_raw(Binary op, const Tensor& a_in, const Tensor& b_in, const char* name) {
  check_operands(a_in, b_in, name);
  const Shape shape = broadcast_shape(a_in.shape(), b_in.shape(), name);
  // Linear cases keep a partial sum: a sum of two partials over the same axes, or a product with
  // one partial factor.
  Tensor a = a_in, b = b_in;
  Axes partial;
  const bool linear_add = (op == Binary::kAdd || op == Binary::kSub) && a.partial() == b.partial();
  const bool linear_mul = (op == Binary::kMul && a.is_partial() != b.is_partial()) ||
                          (op == Binary::kDiv && a.is_partial() && !b.is_partial());
  if (linear_add) {
    partial = a.partial();
  } else if (linear_mul) {
    partial = a.is_partial() ? a.partial() : b.partial();
    if (a.is_partial()) b = reduce_raw(b, nullptr);
    else a = reduce_raw(a, nullptr);
  } else {
    a = reduce_raw(a, nullptr);
    b = reduce_raw(b, nullptr);
  }
  // Output dims: a's where a spans the dimension, else b's, never an axis twice or a partial axis.
  const size_t r = shape.rank();
  const Dims ad = dims_of(a.sharding(), a.rank()), bd = dims_of(b.sharding(), b.rank());
  Dims out(r);
  Axes used = partial;
  for (size_t i = 0; i < r; ++i) {
    const size_t oa = r - a.rank();
    if (i >= oa && a.shape()[i - oa] == shape[i]) {
      out[i] = minus(ad[i - oa], used);
      used = united(used, out[i]);
    }
  }
  for (size_t i = 0; i < r; ++i) {
    const size_t ob = r - b.rank();
    if (out[i].empty() && i >= ob && b.shape()[i - ob] == shape[i]) {
      out[i] = minus(bd[i - ob], used);
      used = united(used, out[i]);
    }
  }
  // A partial operand cannot move between blocks; its dims already fit (checked next), so only
  // the other operand is resharded.
  auto place = [&](const Tensor& x) {
    return x.is_partial() ? x : reshard_raw(x, with_dims(x.mesh(), operand_dims(x.shape(), shape, out)));
  };
  // A partial operand's sharding fixes the output dims it spans; make sure both agree.
  if (a.is_partial() && dims_of(a.sharding(), a.rank()) != operand_dims(a.shape(), shape, out)) {
    a = reduce_raw(a, nullptr);
    if (!linear_mul) b = reduce_raw(b, nullptr);
    return binary_raw(op, a, b, name);
  }
  if (b.is_partial() && dims_of(b.sharding(), b.rank()) != operand_dims(b.shape(), shape, out)) {
    b = reduce_raw(b, nullptr);
    if (!linear_mul) a = reduce_raw(a, nullptr);
    return binary_raw(op, a, b, name);
  }
  a = place(a);
  b = place(b);
  const DType dtype = a.dtype();
  const bool same = a.shape() == shape && b.shape() == shape;
  return output(a, shape, dtype, with_dims(a.mesh(), out), partial, [&](int64_t device, const Box& box, std::byte* o) {
    if (same) {  // equal blocks: flat loops, split over the cores when this op runs one block
      detail::split_rows(box.volume(), 1, [&](int64_t lo, int64_t hi) {
        const Box flat({lo}, {hi});
        const Shape flat_shape{hi - lo};
        const size_t item = item_size(dtype);
        const std::byte* pa = block(a, device) + lo * static_cast<int64_t>(item);
        const std::byte* pb = block(b, device) + lo * static_cast<int64_t>(item);
        std::byte* po = o + lo * static_cast<int64_t>(item);
        if (dtype == DType::kF32 && (op == Binary::kGeluGrad || op == Binary::kSiluGrad)) {
          (op == Binary::kGeluGrad ? gelu_grad_f32 : silu_grad_f32)(reinterpret_cast<const float*>(pa),
                                                                    reinterpret_cast<const float*>(pb),
                                                                    reinterpret_cast<float*>(po), hi - lo);
        } else if (dtype == DType::kF32) {
          run_binary<float>(op, flat, flat, flat_shape, flat, flat_shape, pa, pb, po);
        } else {
          run_binary<double>(op, flat, flat, flat_shape, flat, flat_shape, pa, pb, po);
        }
      });
    } else {
      broadcast_split(op, dtype, box, block_box(a, device), a.shape(), block_box(b, device), b.shape(), block(a, device),
                      block(b, device), o);
    }
  });
}

enum class Unary { kNeg, kScale, kShift, kRelu, kSquare, kZero, kExp, kLog, kTanh, kGelu, kSilu, kRsqrt, kSigmoid };

Tensor unary_raw(Unary op, const Tensor& x_in, double factor, const char* name) {
  check_float(x_in, name);
  const bool linear = op == Unary::kNeg || op == Unary::kScale || op == Unary::kZero;
  const Tensor x = linear ? x_in : reduce_raw(x_in, nullptr);
  auto apply = [&](auto* in, auto* out, int64_t n) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
    const T f = static_cast<T>(factor);
    switch (op) {
      case Unary::kNeg: for (int64_t i = 0; i < n; ++i) out[i] = -in[i]; break;
      case Unary::kScale: for (int64_t i = 0; i < n; ++i) out[i] = in[i] * f; break;
      case Unary::kRelu: for (int64_t i = 0; i < n; ++i) out[i] = in[i] > T(0) ? in[i] : T(0); break;
      case Unary::kSquare: for (int64_t i = 0; i < n; ++i) out[i] = in[i] * in[i]; break;
      case Unary::kZero: std::fill(out, out + n, T(0)); break;  // not in * 0: inf * 0 is NaN
      case Unary::kShift: for (int64_t i = 0; i < n; ++i) out[i] = in[i] + f; break;
      case Unary::kExp: for (int64_t i = 0; i < n; ++i) out[i] = std::exp(in[i]); break;
      case Unary::kLog: for (int64_t i = 0; i < n; ++i) out[i] = std::log(in[i]); break;
      case Unary::kTanh: for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(in[i]); break;
      case Unary::kGelu: for (int64_t i = 0; i < n; ++i) out[i] = gelu_of(in[i]); break;
      case Unary::kSilu: for (int64_t i = 0; i < n; ++i) out[i] = in[i] * sigmoid_of(in[i]); break;
      case Unary::kRsqrt: for (int64_t i = 0; i < n; ++i) out[i] = T(1) / std::sqrt(in[i]); break;
      case Unary::kSigmoid: for (int64_t i = 0; i < n; ++i) out[i] = sigmoid_of(in[i]); break;
    }
  };
  return output(x, x.shape(), x.dtype(), x.sharding(), x.partial(), [&](int64_t device, const Box& box, std::byte* o) {
    detail::split_range(box.volume(), 1 << 14, [&](int64_t lo, int64_t hi) {
      const int64_t n = hi - lo;
      if (x.dtype() == DType::kF32) {
        const float* in = reinterpret_cast<const float*>(block(x, device)) + lo;
        float* out = reinterpret_cast<float*>(o) + lo;
        if (op == Unary::kExp) {
          exp_f32(in, out, n);
        } else if (op == Unary::kGelu) {
          gelu_f32(in, out, n);
        } else if (op == Unary::kSilu) {
          silu_f32(in, out, n);
        } else {
          apply(in, out, n);
        }
      } else {
        apply(reinterpret_cast<const double*>(block(x, device)) + lo, reinterpret_cast<double*>(o) + lo, n);
      }
    });
  });
}

// --- reductions
// Sums over `dim`, dropping it or keeping it with size 1. A split `dim` leaves a partial sum over
// its axes.
Tensor sum_raw(const Tensor& x, size_t dim, bool keep) {
  check_float(x, "sum");
  if (dim >= x.rank()) throw ValueError("sum: dimension " + std::to_string(dim) + " of " + x.to_string());
  Dims d = dims_of(x.sharding(), x.rank());
  const Axes partial = united(x.partial(), d[dim]);
  std::vector<int64_t> shape(x.shape().dims().begin(), x.shape().dims().end());
  if (keep) {
    shape[dim] = 1;
    d[dim] = {};
  } else {
    shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(dim));
    d.erase(d.begin() + static_cast<std::ptrdiff_t>(dim));
  }
  return output(x, Shape(shape), x.dtype(), with_dims(x.mesh(), d), partial, [&](int64_t device, const Box&, std::byte* o) {
    const Box& xb = block_box(x, device);
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < dim; ++i) outer *= xb.extent(i);
    for (size_t i = dim + 1; i < xb.rank(); ++i) inner *= xb.extent(i);
    const int64_t n = xb.extent(dim);
    auto run = [&](auto* in, auto* out) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
      if constexpr (std::is_same_v<T, float>) {
        if (inner == 1) return row_sums_f32(in, out, outer, n);
      }
      for (int64_t a = 0; a < outer; ++a) {
        T* row = out + a * inner;
        std::fill(row, row + inner, T(0));
        for (int64_t j = 0; j < n; ++j) {
          const T* src = in + (a * n + j) * inner;
          for (int64_t i = 0; i < inner; ++i) row[i] += src[i];
        }
      }
    };
    if (x.dtype() == DType::kF32) {
      run(reinterpret_cast<const float*>(block(x, device)), reinterpret_cast<float*>(o));
    } else {
      run(reinterpret_cast<const double*>(block(x, device)), reinterpret_cast<double*>(o));
    }
  });
}

// The maximum over `dim`, kept with size 1: each device's local maximum, then an all-reduce(max)
// over the axes that split `dim`.
Tensor max_raw(const Tensor& x_in, size_t dim) {
  check_float(x_in, "max");
  if (dim >= x_in.rank()) throw ValueError("max: dimension " + std::to_string(dim) + " of " + x_in.to_string());
  if (x_in.shape()[dim] == 0) throw ValueError("max over an empty dimension: " + x_in.to_string());
  const Tensor x = reduce_raw(x_in, nullptr);
  Dims d = dims_of(x.sharding(), x.rank());
  const Axes split = d[dim];
  std::vector<int64_t> shape(x.shape().dims().begin(), x.shape().dims().end());
  shape[dim] = 1;
  d[dim] = {};
  const NamedSharding sharding = with_dims(x.mesh(), d);
  if (x.is_abstract()) return Tensor::abstract(Shape(shape), x.dtype(), sharding);
  Array local = detail::compute_shards(x.shards().runtime(), Shape(shape), x.dtype(), sharding,
                                       [&](int64_t device, const Box&, std::byte* o) {
    const Box& xb = block_box(x, device);
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < dim; ++i) outer *= xb.extent(i);
    for (size_t i = dim + 1; i < xb.rank(); ++i) inner *= xb.extent(i);
    const int64_t n = xb.extent(dim);
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = reinterpret_cast<const T*>(block(x, device));
      T* out = reinterpret_cast<T*>(o);
      for (int64_t a = 0; a < outer; ++a) {
        T* row = out + a * inner;
        std::fill(row, row + inner, -std::numeric_limits<T>::infinity());
        for (int64_t j = 0; j < n; ++j) {
          const T* src = in + (a * n + j) * inner;
          for (int64_t i = 0; i < inner; ++i) row[i] = std::max(row[i], src[i]);
        }
      }
    });
  });
  if (!split.empty()) local = all_reduce(local, split, Reduction::kMax);
  return Tensor(std::move(local));
}

// Removes dimension `dim` of size 1 (same bytes, one dimension fewer).
Tensor squeeze_raw(const Tensor& x, size_t dim) {
  std::vector<int64_t> shape(x.shape().dims().begin(), x.shape().dims().end());
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(dim));
  Dims d = dims_of(x.sharding(), x.rank());
  d.erase(d.begin() + static_cast<std::ptrdiff_t>(dim));
  const NamedSharding s = with_dims(x.mesh(), d);
  if (x.is_abstract()) return Tensor::abstract(Shape(shape), x.dtype(), s, x.partial());
  const Array& a = x.shards();
  std::vector<Shard> shards;
  for (const Shard& sh : a.shards()) shards.push_back({sh.device, s.device_box(sh.device, Shape(shape)), sh.replica_id, sh.buffer});
  Array out(a.runtime(), Shape(shape), a.dtype(), s, std::move(shards));
  return x.is_partial() ? Tensor::partial_sum(std::move(out), x.partial()) : Tensor(std::move(out));
}

Tensor detach(const Tensor& x) { return x.with_node(nullptr); }

}  // namespace

// --- public ops with their gradients

Tensor reduce(const Tensor& x) {
  if (!x.is_partial()) return x;
  return record(reduce_raw(x, nullptr), {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor reshard(const Tensor& x, const NamedSharding& target) {
  if (target.spec().size() > x.rank()) {
    throw ValueError("reshard: " + target.spec().to_string() + " has more dimensions than " + x.to_string());
  }
  Tensor out = reduce_raw(x, &target);
  out = reshard_raw(out, target);
  const NamedSharding from = x.sharding();
  return record(out, {x}, [from](const Tensor& g) { return std::vector<Tensor>{reshard(g, from)}; });
}

Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec) {
  return reshard(x, NamedSharding(x.mesh(), spec));
}

Tensor with_sharding_constraint(const Tensor& x, const LogicalAxes& logical, const LogicalRules& rules) {
  if (logical.size() != x.rank()) {
    throw ValueError("with_sharding_constraint: " + std::to_string(logical.size()) + " logical axes for " +
                     x.to_string());
  }
  return with_sharding_constraint(x, rules.logical_to_mesh_axes(logical, "with_sharding_constraint"));
}

Tensor add(const Tensor& a, const Tensor& b) {
  return record(binary_raw(Binary::kAdd, a, b, "add"), {a, b},
                [as = a.shape(), bs = b.shape(), na = needs(a), nb = needs(b)](const Tensor& g) {
                  return std::vector<Tensor>{na ? sum_to(g, as) : Tensor(), nb ? sum_to(g, bs) : Tensor()};
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return record(binary_raw(Binary::kSub, a, b, "sub"), {a, b},
                [as = a.shape(), bs = b.shape(), na = needs(a), nb = needs(b)](const Tensor& g) {
                  return std::vector<Tensor>{na ? sum_to(g, as) : Tensor(), nb ? neg(sum_to(g, bs)) : Tensor()};
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return record(binary_raw(Binary::kMul, a, b, "mul"), {a, b}, [a, b](const Tensor& g) {
    return std::vector<Tensor>{needs(a) ? sum_to(mul(g, b), a.shape()) : Tensor(),
                               needs(b) ? sum_to(mul(g, a), b.shape()) : Tensor()};
  });
}

Tensor neg(const Tensor& x) {
  return record(unary_raw(Unary::kNeg, x, 0, "neg"), {x}, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

Tensor scale(const Tensor& x, double factor) {
  return record(unary_raw(Unary::kScale, x, factor, "scale"), {x},
                [factor](const Tensor& g) { return std::vector<Tensor>{scale(g, factor)}; });
}

Tensor relu(const Tensor& x) {
  return record(unary_raw(Unary::kRelu, x, 0, "relu"), {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kReluGrad, x, g, "relu gradient")};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::kDiv, a, b, "div");
  return record(out, {a, b}, [a, b, y = detach(out)](const Tensor& g) {
    return std::vector<Tensor>{sum_to(div(g, b), a.shape()), sum_to(neg(div(mul(g, y), b)), b.shape())};
  });
}

Tensor add_scalar(const Tensor& x, double value) {
  return record(unary_raw(Unary::kShift, x, value, "add_scalar"), {x},
                [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_raw(Unary::kExp, x, 0, "exp");
  return record(out, {x}, [y = detach(out)](const Tensor& g) { return std::vector<Tensor>{mul(g, y)}; });
}

Tensor log(const Tensor& x) {
  return record(unary_raw(Unary::kLog, x, 0, "log"), {x}, [x](const Tensor& g) { return std::vector<Tensor>{div(g, x)}; });
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_raw(Unary::kTanh, x, 0, "tanh");
  return record(out, {x}, [y = detach(out)](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kTanhGrad, y, g, "tanh gradient")};
  });
}

Tensor gelu(const Tensor& x) {
  return record(unary_raw(Unary::kGelu, x, 0, "gelu"), {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kGeluGrad, x, g, "gelu gradient")};
  });
}

Tensor silu(const Tensor& x) {
  return record(unary_raw(Unary::kSilu, x, 0, "silu"), {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kSiluGrad, x, g, "silu gradient")};
  });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_raw(Unary::kSigmoid, x, 0, "sigmoid");
  return record(out, {x}, [y = detach(out)](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kSigmoidGrad, y, g, "sigmoid gradient")};
  });
}

Tensor clip(const Tensor& x, double lo, double hi) {
  if (!(lo <= hi)) throw ValueError("clip: needs lo <= hi, got " + std::to_string(lo) + " and " + std::to_string(hi));
  // x - relu(x - hi) + relu(lo - x): exact, and its gradient is 1 strictly inside the range.
  Tensor out = x;
  if (std::isfinite(hi)) out = sub(out, relu(add_scalar(x, -hi)));
  if (std::isfinite(lo)) out = add(out, relu(add_scalar(neg(x), lo)));
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = unary_raw(Unary::kRsqrt, x, 0, "rsqrt");
  return record(out, {x}, [y = detach(out)](const Tensor& g) {
    return std::vector<Tensor>{binary_raw(Binary::kRsqrtGrad, y, g, "rsqrt gradient")};
  });
}

Tensor square(const Tensor& x) {
  return record(unary_raw(Unary::kSquare, x, 0, "square"), {x},
                [x](const Tensor& g) { return std::vector<Tensor>{mul(g, scale(x, 2.0))}; });
}

namespace {
// The gradient of a sum over `dim`: g broadcast back along it, on x's sharding.
Tensor expand_like(const Tensor& g, const Tensor& x, size_t dim, bool kept) {
  Tensor gk = g;
  if (!kept) {
    // Reinsert the summed dimension with size 1; the add below broadcasts along it.
    std::vector<int64_t> shape(g.shape().dims().begin(), g.shape().dims().end());
    shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(dim), 1);
    Dims d = dims_of(g.sharding(), g.rank());
    d.insert(d.begin() + static_cast<std::ptrdiff_t>(dim), DimSharding{});
    const Tensor placed = reduce_raw(g, nullptr);
    if (placed.is_abstract()) {
      gk = Tensor::abstract(Shape(shape), placed.dtype(), with_dims(placed.mesh(), d));
    } else {
      // Same bytes, one more dimension of size 1: rebuild the array around the same buffers.
      const Array& a = placed.array();
      std::vector<Shard> shards;
      const NamedSharding s = with_dims(a.mesh(), d);
      for (const Shard& sh : a.shards()) {
        shards.push_back({sh.device, s.device_box(sh.device, Shape(shape)), sh.replica_id, sh.buffer});
      }
      gk = Tensor(Array(a.runtime(), Shape(shape), a.dtype(), s, std::move(shards)));
    }
  }
  // Broadcast gk to x's shape and sharding. Only x's layout matters: a partial x is read as its
  // contributions (never reduced for nothing).
  const Tensor layout = x.is_abstract() ? Tensor::abstract(x.shape(), x.dtype(), x.sharding()) : Tensor(x.shards());
  return binary_raw(Binary::kFirst, gk, layout, "sum gradient");
}
}  // namespace

Tensor broadcast_like(const Tensor& x, const Tensor& like) {
  const Tensor layout = like.is_abstract() ? Tensor::abstract(like.shape(), like.dtype(), like.sharding())
                                           : Tensor(like.shards());
  if (broadcast_shape(x.shape(), like.shape(), "broadcast_like") != like.shape())
    throw ValueError("broadcast_like: " + x.to_string() + " does not broadcast to " + like.shape().to_string());
  Tensor out = binary_raw(Binary::kFirst, x, layout, "broadcast_like");
  if (!(out.sharding() == like.sharding())) out = reshard_raw(reduce_raw(out, nullptr), like.sharding());
  return record(out, {x}, [shape = x.shape()](const Tensor& g) { return std::vector<Tensor>{sum_to(g, shape)}; });
}

Tensor sum(const Tensor& x, size_t dim, bool keepdims) {
  return record(sum_raw(x, dim, keepdims), {x}, [x, dim, keepdims](const Tensor& g) {
    return std::vector<Tensor>{expand_like(g, x, dim, keepdims)};
  });
}

Tensor mean(const Tensor& x, size_t dim, bool keepdims) {
  if (dim >= x.rank()) throw ValueError("mean: dimension " + std::to_string(dim) + " of " + x.to_string());
  const int64_t n = x.shape()[dim];
  return scale(sum(x, dim, keepdims), n == 0 ? 0.0 : 1.0 / static_cast<double>(n));
}

Tensor max(const Tensor& x, size_t dim, bool keepdims) {
  Tensor m = max_raw(x, dim);
  // The gradient is shared evenly between the positions that attain the maximum (as PyTorch's
  // amax does).
  const Tensor mk = m;
  Tensor out = keepdims ? m : squeeze_raw(m, dim);
  return record(out, {x}, [x = detach(x), mk, dim, keepdims](const Tensor& g) {
    const Tensor mask = binary_raw(Binary::kEqMask, x, mk, "max gradient");
    const Tensor count = sum(mask, dim, true);
    const Tensor gk = keepdims ? g : expand_like(g, mk, dim, false);
    return std::vector<Tensor>{mul(mask, div(gk, count))};
  });
}

Tensor stop_gradient(const Tensor& x) { return detach(x); }

Tensor sum(const Tensor& x) {
  Tensor out = x;
  while (out.rank() > 0) out = sum(out, out.rank() - 1);
  return out;
}

Tensor mean(const Tensor& x) {
  const int64_t n = x.shape().num_elements();
  return scale(sum(x), n == 0 ? 0.0 : 1.0 / static_cast<double>(n));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor out = x;
  const size_t extra = x.rank() - shape.rank();
  if (x.rank() < shape.rank()) throw ValueError("sum_to: " + x.to_string() + " has fewer dimensions than " + shape.to_string());
  for (size_t i = 0; i < extra; ++i) out = sum(out, 0);
  for (size_t i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1 && out.shape()[i] != 1) {
      const Tensor in = out;
      out = record(sum_raw(in, i, true), {in}, [in, i](const Tensor& g) {
        return std::vector<Tensor>{expand_like(g, in, i, true)};
      });
    }
  }
  return out;
}

namespace {

// Softmax over an unsplit last dimension in one pass per row, forward and backward.
Tensor softmax_fused(const Tensor& x_in) {
  const Tensor x = reduce_raw(x_in, nullptr);
  auto rows_kernel = [](auto&& per_rows) {
    return [per_rows](int64_t device, const Box& box, std::byte* o) {
      const int64_t n_last = box.extent(box.rank() - 1);
      const int64_t rows = n_last == 0 ? 0 : box.volume() / n_last;
      detail::split_range(rows, 16, [&](int64_t lo, int64_t hi) {
        per_rows(device, o, lo, hi, n_last);
      });
    };
  };
  Tensor y = output(x, x.shape(), x.dtype(), x.sharding(), {},
                    rows_kernel([&](int64_t device, std::byte* o, int64_t lo, int64_t hi, int64_t len) {
                      dispatch_float(x.dtype(), [&](auto zero) {
                        using T = decltype(zero);
                        softmax_rows(reinterpret_cast<const T*>(block(x, device)) + lo * len,
                                     reinterpret_cast<T*>(o) + lo * len, hi - lo, len);
                      });
                    }));
  return record(y, {x_in}, [y = detach(y), rows_kernel](const Tensor& g_in) {
    const Tensor g = reshard_raw(reduce_raw(g_in, nullptr), y.sharding());
    return std::vector<Tensor>{output(y, y.shape(), y.dtype(), y.sharding(), {},
                                      rows_kernel([&](int64_t device, std::byte* o, int64_t lo, int64_t hi, int64_t len) {
                                        dispatch_float(y.dtype(), [&](auto zero) {
                                          using T = decltype(zero);
                                          softmax_grad_rows(reinterpret_cast<const T*>(block(y, device)) + lo * len,
                                                            reinterpret_cast<const T*>(block(g, device)) + lo * len,
                                                            reinterpret_cast<T*>(o) + lo * len, hi - lo, len);
                                        });
                                      }))};
  });
}

}  // namespace

Tensor softmax(const Tensor& x, size_t dim) {
  check_float(x, "softmax");
  if (dim >= x.rank()) throw ValueError("softmax: dimension " + std::to_string(dim) + " of " + x.to_string());
  if (dim + 1 == x.rank() && last_dim_whole(x)) return softmax_fused(x);
  // Shifted by the maximum for range; the shift cancels, so no gradient flows through it.
  const Tensor e = exp(sub(x, stop_gradient(max(x, dim, true))));
  return div(e, sum(e, dim, true));
}

namespace {

// rms_norm's scale gradient, the sum over the leading dimensions of g * (x * inv) (inv [..., 1]
// per row), as sum_to(mul(g, mul(x, inv)), {n}) computes it: each product rounded, the leading
// dimensions summed one after another from the first, each in index order: the same bits, without
// writing the two products. A partial sum over the axes that split the rows. Spread over the
// cores by columns, so a column's order of additions stays the same on any number of cores.
Tensor scale_grad(const Tensor& x, const Tensor& g, const Tensor& inv) {
  const size_t r = x.rank();
  const int64_t n = x.shape()[r - 1];
  Axes partial;
  const Dims d = dims_of(x.sharding(), r);
  for (size_t i = 0; i + 1 < r; ++i) partial = united(partial, d[i]);
  return output(x, Shape{n}, x.dtype(), NamedSharding(x.mesh(), {}), partial,
                [&](int64_t device, const Box&, std::byte* o) {
    const Box& xb = block_box(x, device);
    // The leading extents, first to last.
    std::vector<int64_t> lead;
    for (size_t i = 0; i + 1 < r; ++i) lead.push_back(xb.extent(i));
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* px = reinterpret_cast<const T*>(block(x, device));
      const T* pg = reinterpret_cast<const T*>(block(g, device));
      const T* pi = reinterpret_cast<const T*>(block(inv, device));
      T* out = reinterpret_cast<T*>(o);
      int64_t after_first = 1;  // rows left once the first leading dimension is summed
      for (size_t i = 1; i < lead.size(); ++i) after_first *= lead[i];
      const int64_t first = lead.empty() ? 1 : lead[0];
      if (after_first == 0) {  // an empty block: a sum of nothing
        std::fill(out, out + n, T(0));
        return;
      }
      detail::split_range(n, 16, [&](int64_t c0, int64_t c1) {
        const int64_t w = c1 - c0;
        int64_t rest = after_first;
        // sums[q][c]: rows q of what is left after the first leading dimension's sum.
        std::vector<T> sums(static_cast<size_t>(rest * w), T(0));
        for (int64_t q = 0; q < rest; ++q) {
          T* acc = sums.data() + q * w;
          for (int64_t a = 0; a < first; ++a) {
            const int64_t row = a * rest + q;
            const T iv = pi[row];
            const T* xr = px + row * n + c0;
            const T* gr = pg + row * n + c0;
            rms_scale_grad_row(xr, gr, iv, acc, w);
          }
        }
        // The other leading dimensions, each summed in order, the first of them next.
        for (size_t i = 1; i < lead.size(); ++i) {
          const int64_t e = lead[i];
          const int64_t left = rest / e;
          std::vector<T> next(static_cast<size_t>(left * w), T(0));
          for (int64_t q = 0; q < left; ++q)
            for (int64_t j = 0; j < e; ++j)
              for (int64_t c = 0; c < w; ++c) next[q * w + c] += sums[(j * left + q) * w + c];
          sums = std::move(next);
          rest = left;
        }
        std::copy(sums.begin(), sums.begin() + w, out + c0);
      });
    });
  });
}

}  // namespace

Tensor rms_norm(const Tensor& x_in, const Tensor& scale_in, double eps) {
  check_operands(x_in, scale_in, "rms_norm");
  const size_t r = x_in.rank();
  if (r < 1 || scale_in.rank() != 1 || scale_in.shape()[0] != x_in.shape()[r - 1]) {
    throw ValueError("rms_norm: the scale " + scale_in.to_string() + " does not match the last dimension of " +
                     x_in.to_string());
  }
  // The fused kernel needs whole rows; a split last dimension takes the composite path.
  const Tensor x = reduce_raw(x_in, nullptr);
  if (!last_dim_whole(x)) {
    const Tensor inv = rsqrt(add_scalar(mean(square(x_in), r - 1, true), eps));
    return mul(mul(x_in, inv), scale_in);
  }
  const Tensor scale = reshard_raw(reduce_raw(scale_in, nullptr), NamedSharding(x.mesh(), {}));
  const int64_t n = x.shape()[r - 1];
  // The per-row inverse norms, kept for the backward pass: [..., 1] split like x's rows.
  std::vector<int64_t> rows_shape(x.shape().dims().begin(), x.shape().dims().end());
  rows_shape.back() = 1;
  Dims rows_dims = dims_of(x.sharding(), r);
  const NamedSharding rows_sharding = with_dims(x.mesh(), rows_dims);
  Tensor inv;
  if (x.is_abstract()) {
    inv = Tensor::abstract(Shape(rows_shape), x.dtype(), rows_sharding);
  } else {
    // Written below through each block's first local holder (y's blocks are computed once): the
    // other local replicas share its bytes.
    inv = Tensor(detail::compute_blocks_once(x.shards().runtime(), Shape(rows_shape), x.dtype(), rows_sharding,
                                             [](int64_t, const Box&, std::byte*) {}));
  }
  Tensor y = output(x, x.shape(), x.dtype(), x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t rows = n == 0 ? 0 : box.volume() / n;
    detail::split_range(rows, 16, [&](int64_t lo, int64_t hi) {
      dispatch_float(x.dtype(), [&](auto zero) {
        using T = decltype(zero);
        T* iv = reinterpret_cast<T*>(const_cast<std::byte*>(block(inv, device)));
        rms_rows(reinterpret_cast<const T*>(block(x, device)) + lo * n, reinterpret_cast<const T*>(block(scale, device)),
                 reinterpret_cast<T*>(o) + lo * n, iv + lo, hi - lo, n, eps);
      });
    });
  });
  return record_folding(y, {x_in, scale_in}, [x, scale, inv, n, nx = needs(x_in), ns = needs(scale_in)](
                                                 const Tensor& g_in, std::vector<Tensor>& pending) {
    const Tensor g = reshard_raw(reduce_raw(g_in, nullptr), x.sharding());
    Tensor dx, dscale;
    if (nx) {
      // x's gradient so far (the residual stream's, from the block x feeds) added as dx is
      // written: each element pending + dx, the bits of add(pending, dx).
      Tensor plus;
      if (folds_into(pending[0], x, x.sharding())) plus = std::exchange(pending[0], Tensor());
      dx = output(x, x.shape(), x.dtype(), x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
        const int64_t rows = n == 0 ? 0 : box.volume() / n;
        detail::split_range(rows, 16, [&](int64_t lo, int64_t hi) {
          dispatch_float(x.dtype(), [&](auto zero) {
            using T = decltype(zero);
            rms_grad_rows(reinterpret_cast<const T*>(block(x, device)) + lo * n,
                          reinterpret_cast<const T*>(block(scale, device)),
                          reinterpret_cast<const T*>(block(inv, device)) + lo,
                          reinterpret_cast<const T*>(block(g, device)) + lo * n,
                          plus.defined() ? reinterpret_cast<const T*>(block(plus, device)) + lo * n : nullptr,
                          reinterpret_cast<T*>(o) + lo * n, hi - lo, n);
          });
        });
      });
    }
    // dscale = sum over rows of g * x * inv: a partial sum over the axes splitting the rows.
    if (ns) dscale = scale_grad(x, g, inv);
    return std::vector<Tensor>{dx, dscale};
  });
}

Tensor log_softmax(const Tensor& x, size_t dim) {
  const Tensor shifted = sub(x, stop_gradient(max(x, dim, true)));
  return sub(shifted, log(sum(exp(shifted), dim, true)));
}

}  // namespace tessel::ops
