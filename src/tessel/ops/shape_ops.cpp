// Ops that move elements rather than compute on them (reshape, transpose, index), lookups
// (take, one_hot) and casts. Rotary embeddings and the causal mask: positional.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/ids.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/cast.h"

namespace tessel::ops {
namespace {

using namespace detail;

// Row-major strides (in elements) of a block with `box`'s extents.
std::vector<int64_t> strides_of(const Box& box) {
  std::vector<int64_t> s(box.rank(), 1);
  for (size_t i = box.rank(); i-- > 1;) s[i - 1] = s[i] * box.extent(i);
  return s;
}

Tensor with_partial(Array a, const Axes& partial) {
  return partial.empty() ? Tensor(std::move(a)) : Tensor::partial_sum(std::move(a), partial);
}

// The same bytes seen with another shape and sharding: each device's block must already be
// laid out as the new block (the caller checks).
Tensor relabel(const Tensor& x, const Shape& shape, const NamedSharding& sharding) {
  if (x.is_abstract()) return Tensor::abstract(shape, x.dtype(), sharding, x.partial());
  const Array& a = x.shards();
  std::vector<Shard> shards;
  for (const Shard& sh : a.shards()) {
    shards.push_back({sh.device, sharding.device_box(sh.device, shape), sh.replica_id, sh.buffer});
  }
  return with_partial(Array(a.runtime(), shape, a.dtype(), sharding, std::move(shards)), x.partial());
}

// Groups of input and output dimensions whose products match (the minimal such groups), in
// order. A group may have no input dimension or no output dimension only for size-1 dims.
struct DimGroup {
  std::vector<size_t> in, out;
};

std::vector<DimGroup> reshape_groups(const Shape& from, const Shape& to) {
  std::vector<DimGroup> groups;
  size_t i = 0, j = 0;
  while (i < from.rank() || j < to.rank()) {
    DimGroup g;
    if (i == from.rank()) {
      g.out.push_back(j++);
    } else if (j == to.rank()) {
      g.in.push_back(i++);
    } else {
      int64_t pi = from[i], pj = to[j];
      g.in.push_back(i++);
      g.out.push_back(j++);
      while (pi != pj) {
        if (pi < pj) {
          pi *= from[i];
          g.in.push_back(i++);
        } else {
          pj *= to[j];
          g.out.push_back(j++);
        }
      }
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// The gradient of take with respect to the table: rows of g added at their ids; a partial sum
// over the axes that split g's leading dimensions.
Tensor take_grad(const Tensor& g_in, const Tensor& ids_in, const Tensor& table) {
  const Tensor g = reduce_raw(g_in, nullptr);
  const size_t r = g.rank();
  const Dims gd = dims_of(g.sharding(), r);
  const Dims lead(gd.begin(), gd.end() - 1);
  const Tensor ids = reshard_raw(ids_in, with_dims(ids_in.mesh(), lead));
  const Axes lead_axes = all_axes(lead);
  const DimSharding e_axes = gd.back();
  const DimSharding v_axes = minus(dims_of(table.sharding(), 2)[0], united(lead_axes, e_axes));
  const int64_t vocab = table.shape()[0];
  return output(g, table.shape(), g.dtype(), with_dims(g.mesh(), {v_axes, e_axes}), united(lead_axes, {}),
                [&](int64_t device, const Box& box, std::byte* o) {
                  const int64_t v0 = box.start(0), nv = box.extent(0), ne = box.extent(1);
                  const int64_t rows = ids.shards().shard(device).box.volume();
                  for (int64_t i = 0; i < rows; ++i) {
                    const int64_t id = id_at(ids, device, i);
                    if (id < 0 || id >= vocab) bad_id("take", id, vocab);
                  }
                  dispatch_float(g.dtype(), [&](auto zero) {
                    using T = decltype(zero);
                    T* out = reinterpret_cast<T*>(o);
                    const T* src = reinterpret_cast<const T*>(block(g, device));
                    // Each core sums the table rows of its own range of ids, in the order of the
                    // positions: every row's sum is the same whatever the split.
                    split_rows(nv, ne * rows / std::max<int64_t>(nv, 1) + ne, [&](int64_t lo, int64_t hi) {
                      std::fill(out + lo * ne, out + hi * ne, T(0));
                      for (int64_t i = 0; i < rows; ++i) {
                        const int64_t id = id_at(ids, device, i) - v0;
                        if (id < lo || id >= hi) continue;
                        T* row = out + id * ne;
                        for (int64_t e = 0; e < ne; ++e) row[e] += src[i * ne + e];
                      }
                    });
                  });
                });
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  if (shape.num_elements() != x.shape().num_elements()) {
    throw ValueError("reshape: " + x.to_string() + " has " + std::to_string(x.shape().num_elements()) +
                     " elements, " + shape.to_string() + " has " + std::to_string(shape.num_elements()));
  }
  if (shape == x.shape()) return x;
  // A group of dimensions keeps its split when only its first input dimension is split, evenly,
  // and the first output dimension splits evenly the same way: every device's block is then the
  // same run of the group's row-major order. Any other split of a group is gathered first.
  const Dims in = dims_of(x.sharding(), x.rank());
  Dims want = in, out(shape.rank());
  const bool empty = shape.num_elements() == 0;
  for (const DimGroup& g : empty ? std::vector<DimGroup>{} : reshape_groups(x.shape(), shape)) {
    bool keep = !g.in.empty() && !g.out.empty();
    for (size_t k = 1; k < g.in.size(); ++k) keep = keep && in[g.in[k]].empty();
    if (keep && !in[g.in[0]].empty()) {
      const int64_t n = blocks_of(x.mesh(), in[g.in[0]]);
      keep = x.shape()[g.in[0]] % n == 0 && shape[g.out[0]] % n == 0;
    }
    if (keep) {
      out[g.out[0]] = in[g.in[0]];
    } else {
      for (size_t k : g.in) want[k] = {};
    }
  }
  if (empty) want = Dims(x.rank());
  Tensor placed = x;
  if (want != in) placed = reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), want));
  const Shape from = x.shape();
  return record(relabel(placed, shape, with_dims(x.mesh(), out)), {x},
                [from](const Tensor& g) { return std::vector<Tensor>{reshape(g, from)}; });
}

Tensor transpose(const Tensor& x, const std::vector<size_t>& perm) {
  const size_t r = x.rank();
  std::vector<size_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted.size() != r || sorted[i] != i) {
      throw ValueError("transpose: the permutation must list each of the " + std::to_string(r) +
                       " dimensions of " + x.to_string() + " once");
    }
  }
  const Dims in = dims_of(x.sharding(), r);
  Dims d(r);
  std::vector<int64_t> dims(r);
  for (size_t i = 0; i < r; ++i) {
    d[i] = in[perm[i]];
    dims[i] = x.shape()[perm[i]];
  }
  const size_t item = item_size(x.dtype());
  Tensor out = output(x, Shape(dims), x.dtype(), with_dims(x.mesh(), d), x.partial(),
                      [&](int64_t device, const Box& box, std::byte* o) {
                        if (box.volume() == 0) return;
                        const std::vector<int64_t> src_strides = strides_of(block_box(x, device));
                        std::vector<int64_t> stride(r), ext(r);
                        for (size_t i = 0; i < r; ++i) {
                          stride[i] = src_strides[perm[i]];
                          ext[i] = box.extent(i);
                        }
                        const std::byte* src = block(x, device);
                        if (r == 0) {
                          std::memcpy(o, src, item);
                          return;
                        }
                        // Slices of the output's first dimension, split over the cores.
                        const int64_t row_items = box.volume() / ext[0];
                        auto copy_rows = [&](int64_t lo, int64_t hi) {
                          std::vector<int64_t> idx(r, 0), e = ext;
                          e[0] = hi - lo;
                          const int64_t inner = e[r - 1], is = stride[r - 1];
                          int64_t off = lo * stride[0];
                          std::byte* dst = o + lo * row_items * static_cast<int64_t>(item);
                          for (;;) {
                            if (is == 1) {
                              std::memcpy(dst, src + off * static_cast<int64_t>(item), inner * item);
                              dst += inner * static_cast<int64_t>(item);
                            } else {
                              for (int64_t j = 0; j < inner; ++j, dst += item) {
                                std::memcpy(dst, src + (off + j * is) * static_cast<int64_t>(item), item);
                              }
                            }
                            size_t k = r - 1;
                            for (;;) {
                              if (k == 0) return;
                              --k;
                              ++idx[k];
                              off += stride[k];
                              if (idx[k] < e[k]) break;
                              off -= stride[k] * e[k];
                              idx[k] = 0;
                            }
                          }
                        };
                        detail::split_rows(ext[0], row_items, copy_rows);
                      });
  std::vector<size_t> inverse(r);
  for (size_t i = 0; i < r; ++i) inverse[perm[i]] = i;
  return record(out, {x}, [inverse](const Tensor& g) { return std::vector<Tensor>{transpose(g, inverse)}; });
}

namespace {

// A row-major box seen along `dim`: `outer` runs of `n` slabs of `inner` elements each.
struct AlongDim {
  int64_t outer = 1, n = 1, inner = 1;
};
AlongDim along(const Box& box, size_t dim) {
  AlongDim a;
  for (size_t k = 0; k < dim; ++k) a.outer *= box.extent(k);
  a.n = box.extent(dim);
  for (size_t k = dim + 1; k < box.rank(); ++k) a.inner *= box.extent(k);
  return a;
}

// Copies `len` positions along `dim` from a block of extent n_src there (from src_off) into a
// block of extent n_dst (at dst_off); both blocks alike in every other dimension (`box`).
void copy_along(const Box& box, size_t dim, size_t item, const std::byte* src, int64_t n_src, int64_t src_off,
                std::byte* dst, int64_t n_dst, int64_t dst_off, int64_t len) {
  const AlongDim s = along(box, dim);
  const int64_t outer = s.outer, inner = s.inner * static_cast<int64_t>(item);
  if (len <= 0 || inner == 0) return;
  for (int64_t a = 0; a < outer; ++a)
    std::memcpy(dst + (a * n_dst + dst_off) * inner, src + (a * n_src + src_off) * inner, static_cast<size_t>(len * inner));
}

// x with `dim` whole (reduced first when it has to move).
Tensor whole_along(const Tensor& x, size_t dim) {
  Dims d = dims_of(x.sharding(), x.rank());
  if (d[dim].empty()) return x;
  d[dim] = {};
  return reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), d));
}

// `shape` of zeros with g at [start, start + g's extent) along dim: the gradient of slice.
Tensor pad_along(const Tensor& g_in, const Shape& shape, size_t dim, int64_t start) {
  const Tensor g = whole_along(g_in, dim);
  const int64_t n = g.shape()[dim], total = shape[dim];
  const size_t item = item_size(g.dtype());
  return output(g, shape, g.dtype(), g.sharding(), g.partial(), [&](int64_t device, const Box& box, std::byte* o) {
    std::memset(o, 0, static_cast<size_t>(box.volume()) * item);
    copy_along(box, dim, item, block(g, device), n, 0, o, total, start, n);
  });
}

Tensor slice_raw(const Tensor& x_in, size_t dim, int64_t start, int64_t size) {
  const Tensor x = whole_along(x_in, dim);
  std::vector<int64_t> dims(x.shape().dims().begin(), x.shape().dims().end());
  dims[dim] = size;
  const size_t item = item_size(x.dtype());
  const int64_t n = x.shape()[dim];
  return output(x, Shape(dims), x.dtype(), x.sharding(), x.partial(), [&](int64_t device, const Box& box, std::byte* o) {
    copy_along(box, dim, item, block(x, device), n, start, o, size, 0, size);
  });
}

}  // namespace

Tensor slice(const Tensor& x, size_t dim, int64_t start, int64_t size) {
  if (dim >= x.rank() || start < 0 || size < 0 || start + size > x.shape()[dim])
    throw ValueError(fmt::format("slice: [{}, {}) along dimension {} is not inside {}", start, start + size, dim,
                                 x.to_string()));
  return record(slice_raw(x, dim, start, size), {x}, [shape = x.shape(), dim, start](const Tensor& g) {
    return std::vector<Tensor>{pad_along(g, shape, dim, start)};
  });
}

Tensor concat(const std::vector<Tensor>& parts_in, size_t dim) {
  if (parts_in.empty()) throw ValueError("concat: no tensors");
  const Tensor& first = parts_in.front();
  if (dim >= first.rank()) throw ValueError(fmt::format("concat: no dimension {} in {}", dim, first.to_string()));
  std::vector<int64_t> dims(first.shape().dims().begin(), first.shape().dims().end());
  dims[dim] = 0;
  for (const Tensor& p : parts_in) {
    std::vector<int64_t> pd(p.shape().dims().begin(), p.shape().dims().end());
    if (p.rank() != first.rank() || p.dtype() != first.dtype() || !(p.mesh() == first.mesh()) ||
        !std::equal(pd.begin(), pd.begin() + static_cast<std::ptrdiff_t>(dim), dims.begin()) ||
        !std::equal(pd.begin() + static_cast<std::ptrdiff_t>(dim) + 1, pd.end(), dims.begin() + static_cast<std::ptrdiff_t>(dim) + 1))
      throw ValueError("concat: " + p.to_string() + " does not join " + first.to_string() + " along dimension " +
                       std::to_string(dim));
    dims[dim] += p.shape()[dim];
  }
  // Every part on the first's split, `dim` whole.
  Dims d = dims_of(first.sharding(), first.rank());
  d[dim] = {};
  const NamedSharding sharding = with_dims(first.mesh(), d);
  std::vector<Tensor> parts;
  for (const Tensor& p : parts_in) parts.push_back(reshard_raw(reduce_raw(p, nullptr), sharding));
  const size_t item = item_size(first.dtype());
  const int64_t total = dims[dim];
  Tensor out = output(parts.front(), Shape(dims), first.dtype(), sharding, {}, [&](int64_t device, const Box& box, std::byte* o) {
    int64_t at = 0;
    for (const Tensor& p : parts) {
      const int64_t n = p.shape()[dim];
      copy_along(box, dim, item, block(p, device), n, 0, o, total, at, n);
      at += n;
    }
  });
  std::vector<int64_t> sizes;
  for (const Tensor& p : parts) sizes.push_back(p.shape()[dim]);
  return record(out, parts_in, [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t at = 0;
    for (int64_t n : sizes) {
      grads.push_back(slice_raw(g, dim, at, n));
      at += n;
    }
    return grads;
  });
}

Tensor index(const Tensor& x, size_t dim, int64_t i) {
  if (dim >= x.rank() || i < 0 || i >= x.shape()[dim]) {
    throw ValueError("index: no element " + std::to_string(i) + " along dimension " + std::to_string(dim) + " of " +
                     x.to_string());
  }
  Dims d = dims_of(x.sharding(), x.rank());
  Tensor placed = x;
  if (!d[dim].empty()) {  // only the devices holding element i could answer: gather the dimension
    d[dim] = {};
    placed = reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), d));
  }
  std::vector<int64_t> dims(x.shape().dims().begin(), x.shape().dims().end());
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(dim));
  Dims od = d;
  od.erase(od.begin() + static_cast<std::ptrdiff_t>(dim));
  const size_t item = item_size(x.dtype());
  Tensor out = output(placed, Shape(dims), x.dtype(), with_dims(x.mesh(), od), placed.partial(),
                      [&](int64_t device, const Box& box, std::byte* o) {
                        if (box.volume() == 0) return;
                        const AlongDim s = along(block_box(placed, device), dim);
                        const int64_t inner = s.inner * static_cast<int64_t>(item);
                        const std::byte* src = block(placed, device);
                        // Split over the cores: a scan's layers slice their weights here every step.
                        split_rows(s.outer, s.inner, [&](int64_t lo, int64_t hi) {
                          for (int64_t a = lo; a < hi; ++a) std::memcpy(o + a * inner, src + (a * s.n + i) * inner, inner);
                        });
                      });
  Tensor recorded = record(out, {x}, [shape = x.shape(), dim, i](const Tensor& g) {
    return std::vector<Tensor>{index_put(g, shape, dim, i)};
  });
  if (recorded.node()) recorded.node()->slice = detail::Node::Slice{dim, i};
  return recorded;
}

Tensor index_put(const Tensor& g, const Shape& shape, size_t dim, int64_t i) {
  std::vector<int64_t> dims(g.shape().dims().begin(), g.shape().dims().end());
  if (dim > g.rank() || i < 0 || dim >= shape.rank() || i >= shape[dim]) {
    throw ValueError("index_put: no element " + std::to_string(i) + " along dimension " + std::to_string(dim) +
                     " of " + shape.to_string());
  }
  dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(dim), shape[dim]);
  if (Shape(dims) != shape) throw ValueError("index_put: " + g.to_string() + " is not a slice of " + shape.to_string());
  Dims d = dims_of(g.sharding(), g.rank());
  d.insert(d.begin() + static_cast<std::ptrdiff_t>(dim), DimSharding{});
  const size_t item = item_size(g.dtype());
  Tensor out = output(g, shape, g.dtype(), with_dims(g.mesh(), d), g.partial(),
                      [&](int64_t device, const Box& box, std::byte* o) {
                        if (box.volume() == 0) return;
                        std::memset(o, 0, static_cast<size_t>(box.volume()) * item);
                        const AlongDim s = along(box, dim);
                        const int64_t inner = s.inner * static_cast<int64_t>(item);
                        const std::byte* src = block(g, device);
                        for (int64_t a = 0; a < s.outer; ++a) std::memcpy(o + (a * s.n + i) * inner, src + a * inner, inner);
                      });
  return record(out, {g}, [dim, i](const Tensor& dy) { return std::vector<Tensor>{index(dy, dim, i)}; });
}

Tensor index_put_all(const Shape& shape, size_t dim, const std::vector<std::pair<int64_t, Tensor>>& pieces) {
  if (pieces.empty()) throw ValueError("index_put_all: no gradients to place in " + shape.to_string());
  const Tensor& g0 = pieces.front().second;
  if (dim >= shape.rank()) throw ValueError("index_put_all: no dimension " + std::to_string(dim) + " in " + shape.to_string());
  check_float(g0, "index_put_all");
  std::vector<std::vector<const Tensor*>> at(static_cast<size_t>(shape[dim]));
  std::vector<Tensor> inputs;
  for (const auto& [i, g] : pieces) {
    std::vector<int64_t> dims(g.shape().dims().begin(), g.shape().dims().end());
    if (i < 0 || i >= shape[dim] || g.rank() + 1 != shape.rank())
      throw ValueError("index_put_all: no element " + std::to_string(i) + " of " + g.to_string() + " along dimension " +
                       std::to_string(dim) + " of " + shape.to_string());
    dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(dim), shape[dim]);
    if (Shape(dims) != shape) throw ValueError("index_put_all: " + g.to_string() + " is not a slice of " + shape.to_string());
    if (g.dtype() != g0.dtype() || !(g.sharding() == g0.sharding()) || g.partial() != g0.partial())
      throw ValueError("index_put_all: " + g.to_string() + " and " + g0.to_string() + " differ in dtype or sharding");
    at[static_cast<size_t>(i)].push_back(&g);
    inputs.push_back(g);
  }
  Dims d = dims_of(g0.sharding(), g0.rank());
  d.insert(d.begin() + static_cast<std::ptrdiff_t>(dim), DimSharding{});
  const auto item = static_cast<int64_t>(item_size(g0.dtype()));
  Tensor out = output(g0, shape, g0.dtype(), with_dims(g0.mesh(), d), g0.partial(),
                      [&](int64_t device, const Box& box, std::byte* o) {
                        if (box.volume() == 0) return;
                        const AlongDim slabs = along(box, dim);
                        const int64_t outer = slabs.outer, n = slabs.n, inner = slabs.inner;
                        // Slabs of `inner` elements, one per (outer index, position along dim).
                        split_rows(outer * n, inner, [&](int64_t lo, int64_t hi) {
                          for (int64_t s = lo; s < hi; ++s) {
                            const int64_t a = s / n, j = s % n;
                            std::byte* dst = o + s * inner * item;
                            const auto& list = at[static_cast<size_t>(j)];
                            if (list.empty()) {
                              std::memset(dst, 0, static_cast<size_t>(inner * item));
                              continue;
                            }
                            std::memcpy(dst, block(*list[0], device) + a * inner * item, static_cast<size_t>(inner * item));
                            for (size_t k = 1; k < list.size(); ++k) {
                              dispatch_float(g0.dtype(), [&](auto zero) {
                                using T = decltype(zero);
                                T* y = reinterpret_cast<T*>(dst);
                                const T* x = reinterpret_cast<const T*>(block(*list[k], device)) + a * inner;
                                for (int64_t e = 0; e < inner; ++e) y[e] += x[e];
                              });
                            }
                          }
                        });
                      });
  std::vector<int64_t> where;
  for (const auto& [i, g] : pieces) where.push_back(i);
  return record(out, inputs, [dim, where](const Tensor& dy) {
    std::vector<Tensor> grads;
    for (int64_t i : where) grads.push_back(index(dy, dim, i));
    return grads;
  });
}

Tensor take(const Tensor& table_in, const Tensor& ids_in) {
  check_float(table_in, "take");
  check_ids(ids_in, "take");
  if (table_in.rank() != 2) throw ValueError("take: the table must be [vocab, embed], got " + table_in.to_string());
  if (!(table_in.mesh() == ids_in.mesh())) throw ShardingError("take: table and indices live on different meshes");
  const Tensor table0 = reduce_raw(table_in, nullptr);
  // Output [..., embed]: split like the indices, then embed like the table where the indices do
  // not use those axes. A vocabulary split stays: each device looks up the rows it holds and
  // the result is a partial sum over the vocabulary axes.
  const Dims idd = dims_of(ids_in.sharding(), ids_in.rank());
  const Dims td = dims_of(table0.sharding(), 2);
  const Axes lead = all_axes(idd);
  const DimSharding e_axes = minus(td[1], lead);
  const DimSharding v_axes = minus(td[0], united(lead, e_axes));
  const Tensor table = reshard_raw(table0, with_dims(table0.mesh(), {v_axes, e_axes}));
  const Tensor& ids = ids_in;
  Dims od = idd;
  od.push_back(e_axes);
  std::vector<int64_t> dims(ids.shape().dims().begin(), ids.shape().dims().end());
  dims.push_back(table.shape()[1]);
  const int64_t vocab = table.shape()[0];
  Axes partial = v_axes;
  std::sort(partial.begin(), partial.end());
  Tensor out = output(table, Shape(dims), table.dtype(), with_dims(table.mesh(), od), partial,
                      [&](int64_t device, const Box& box, std::byte* o) {
                        const Box& tb = block_box(table, device);
                        const int64_t v0 = tb.start(0), nv = tb.extent(0), ne = tb.extent(1);
                        const int64_t rows = ne == 0 ? 0 : box.volume() / ne;
                        dispatch_float(table.dtype(), [&](auto zero) {
                          using T = decltype(zero);
                          const T* t = reinterpret_cast<const T*>(block(table, device));
                          T* out_rows = reinterpret_cast<T*>(o);
                          for (int64_t i = 0; i < rows; ++i) {
                            const int64_t id = id_at(ids, device, i);
                            if (id < 0 || id >= vocab) bad_id("take", id, vocab);
                            T* row = out_rows + i * ne;
                            if (id < v0 || id >= v0 + nv) {
                              std::fill(row, row + ne, T(0));
                            } else {
                              std::copy(t + (id - v0) * ne, t + (id - v0 + 1) * ne, row);
                            }
                          }
                        });
                      });
  return record(out, {table_in}, [ids, table_in](const Tensor& g) {
    return std::vector<Tensor>{take_grad(g, ids, table_in)};
  });
}

Tensor one_hot(const Tensor& labels_in, const Tensor& like_in) {
  check_ids(labels_in, "one_hot");
  check_float(like_in, "one_hot");
  const size_t r = like_in.rank();
  if (labels_in.rank() + 1 != r ||
      !std::equal(labels_in.shape().dims().begin(), labels_in.shape().dims().end(), like_in.shape().dims().begin())) {
    throw ValueError("one_hot: labels " + labels_in.to_string() + " do not match the leading dimensions of " +
                     like_in.to_string());
  }
  const Tensor like = like_in.is_partial() ? reduce_raw(like_in, nullptr) : like_in;
  const Dims d = dims_of(like.sharding(), r);
  const Tensor labels = reshard_raw(labels_in, with_dims(like.mesh(), Dims(d.begin(), d.end() - 1)));
  const int64_t classes = like.shape()[r - 1];
  return output(like, like.shape(), like.dtype(), like.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t c0 = box.start(r - 1), nc = box.extent(r - 1);
    const int64_t rows = nc == 0 ? 0 : box.volume() / nc;
    dispatch_float(like.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* out = reinterpret_cast<T*>(o);
      std::fill(out, out + rows * nc, T(0));
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t id = id_at(labels, device, i);
        if (id < 0 || id >= classes) bad_id("one_hot", id, classes);
        if (id >= c0 && id < c0 + nc) out[i * nc + (id - c0)] = T(1);
      }
    });
  });
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  const Tensor placed = reduce_raw(x, nullptr);
  Tensor out = placed.is_abstract() ? Tensor::abstract(placed.shape(), dtype, placed.sharding())
                                    : Tensor(tessel::cast(placed.array(), dtype));
  const DType from = x.dtype();
  return record(out, {x}, [from](const Tensor& g) { return std::vector<Tensor>{cast(g, from)}; });
}

namespace detail {

void check_ids(const Tensor& ids, const char* op) {
  if (ids.dtype() != DType::kI32 && ids.dtype() != DType::kI64) {
    throw ValueError(std::string(op) + " takes i32 or i64 indices, not " + ids.to_string());
  }
  if (ids.is_partial()) throw ValueError(std::string(op) + ": indices cannot be a partial sum: " + ids.to_string());
}

int64_t id_at(const Tensor& ids, int64_t device, int64_t i) {
  const std::byte* p = block(ids, device);
  return ids.dtype() == DType::kI32 ? reinterpret_cast<const int32_t*>(p)[i] : reinterpret_cast<const int64_t*>(p)[i];
}

void bad_id(const char* op, int64_t id, int64_t size) {
  throw ValueError(std::string(op) + ": index " + std::to_string(id) + " is out of range [0, " + std::to_string(size) +
                   ")");
}

}  // namespace detail

}  // namespace tessel::ops
