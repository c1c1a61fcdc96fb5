// Ops that move elements rather than compute on them (reshape, transpose, index), lookups
// (take, one_hot), masks, rotary embeddings and casts.
#include <algorithm>
#include <cmath>
#include <numbers>
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
#include "tessel/ops/detail/rope_kernels.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/cast.h"
#include "tessel/runtime/worker_pool.h"

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

// Rotary position embedding on [..., seq, heads, head_dim] (MaxText's layout: the first and
// second halves of head_dim are the pair), positions = global sequence index. sign = -1 rotates
// back (the gradient).
struct RopeStyle {
  double max_timescale = 10000;
  bool interleaved = false;     // pairs (2k, 2k+1), else (k, k + head_dim / 2)
  bool llama3_scaling = false;  // Llama 3.1's frequency scaling
  std::optional<YarnRope> yarn;  // YaRN's frequencies (max_timescale is yarn's)
  double scale = 1;              // the result times scale
};

// YaRN's frequency of pair k (MaxText's YarnRotaryEmbedding.freqs_cis, after DeepSeek-V3): the
// base frequency blended towards base / factor below the correction range.
double yarn_frequency(const YarnRope& y, int64_t k, int64_t d) {
  const double base = 1.0 / std::pow(y.max_timescale, 2.0 * static_cast<double>(k) / static_cast<double>(d));
  auto correction = [&](double rotations) {
    return static_cast<double>(d) *
           std::log(static_cast<double>(y.original_max_position) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(y.max_timescale));
  };
  double low = correction(y.beta_fast), high = correction(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
  const double smooth = 1 - ramp;
  return base / y.factor * (1 - smooth) + base * smooth;
}

// The angular frequency of pair k of a head of `d`: 1 / max_timescale^(2k/d), then Llama 3.1's
// scaling (MaxText's LLaMARotaryEmbedding._apply_scaling_factor).
double rope_frequency(const RopeStyle& style, int64_t k, int64_t d) {
  if (style.yarn) return yarn_frequency(*style.yarn, k, d);
  const double freq = 1.0 / std::pow(style.max_timescale, 2.0 * static_cast<double>(k) / static_cast<double>(d));
  if (!style.llama3_scaling) return freq;
  constexpr double kFactor = 8, kLow = 1, kHigh = 4, kOriginal = 8192;
  const double wavelen = 2 * std::numbers::pi / freq;
  if (wavelen < kOriginal / kHigh) return freq;
  if (wavelen > kOriginal / kLow) return freq / kFactor;
  const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
  return (1 - smooth) * freq / kFactor + smooth * freq;
}

// cos and sign * sin of every position's angles, [seq, half] each, computed once for all blocks
// (devices that hold the same positions share it), positions spread over the cores.
template <class T>
struct RopeTable {
  std::vector<T> cos, sin;
};

template <class T>
RopeTable<T> rope_table(WorkerPool& pool, int64_t seq, int64_t d, double sign, const RopeStyle& style) {
  const int64_t half = d / 2;
  std::vector<double> freq(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k) freq[k] = rope_frequency(style, k, d);
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

// `scale` multiplies the rotation's output, or with `scale_input` its input (the gradient).
template <class T>
void rope_block(const Box& box, size_t seq_dim, const T* in, T* out, const RopeTable<T>& table, bool interleaved,
                T scale, bool scale_input) {
  const size_t r = box.rank();
  const int64_t d = box.extent(r - 1), half = d / 2;
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < seq_dim; ++i) outer *= box.extent(i);
  for (size_t i = seq_dim + 1; i + 1 < r; ++i) inner *= box.extent(i);
  const int64_t seq = box.extent(seq_dim);
  detail::split_range(seq, 4, [&](int64_t s_lo, int64_t s_hi) {
    for (int64_t s = s_lo; s < s_hi; ++s) {
      const size_t at = static_cast<size_t>((box.start(seq_dim) + s) * half);
      for (int64_t a = 0; a < outer; ++a) {
        const int64_t off = (a * seq + s) * inner * d;
        detail::rope_heads(in + off, out + off, table.cos.data() + at, table.sin.data() + at, inner, half, interleaved,
                           scale, scale_input);
      }
    }
  });
}

Tensor rope_raw(const Tensor& x, size_t seq_dim, double sign, const RopeStyle& style) {
  Dims d = dims_of(x.sharding(), x.rank());
  Tensor placed = x;
  if (!d.back().empty()) {  // a rotation pairs elements half a head apart: head_dim stays whole
    d.back() = {};
    placed = reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), d));
  }
  Tensor out;
  dispatch_float(placed.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const RopeTable<T> table = placed.is_abstract()
                                   ? RopeTable<T>{}
                                   : rope_table<T>(placed.shards().runtime().pool(), placed.shape()[seq_dim],
                                                   placed.shape()[placed.rank() - 1], sign, style);
    out = output(placed, placed.shape(), placed.dtype(), placed.sharding(), placed.partial(),
                  [&](int64_t device, const Box& box, std::byte* o) {
                    // The gradient (sign -1) is scaled before it is rotated back, as scale's own
                    // gradient would come first.
                    rope_block<T>(box, seq_dim, reinterpret_cast<const T*>(block(placed, device)),
                                  reinterpret_cast<T*>(o), table, style.interleaved, static_cast<T>(style.scale),
                                  sign < 0);
                  });
  });
  return out;
}

// x with entries above the diagonal of the last two dimensions (key > query) set to `fill`.
Tensor mask_raw(const Tensor& x_in, double fill, int64_t window) {
  const Tensor x = reduce_raw(x_in, nullptr);
  const size_t r = x.rank();
  return output(x, x.shape(), x.dtype(), x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t nq = box.extent(r - 2), nk = box.extent(r - 1);
    const int64_t q0 = box.start(r - 2), k0 = box.start(r - 1);
    const int64_t planes = nq * nk == 0 ? 0 : box.volume() / (nq * nk);
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = reinterpret_cast<const T*>(block(x, device));
      T* out = reinterpret_cast<T*>(o);
      const T f = static_cast<T>(fill);
      // Row (p, q) keeps the keys k with key position - query position <= 0 and, with a window,
      // > -window: one kept span [lo, hi) between two filled ones. Rows are split over the cores.
      detail::split_range(planes * nq, 16, [&](int64_t row_lo, int64_t row_hi) {
        for (int64_t row = row_lo; row < row_hi; ++row) {
          const int64_t q = row % nq, off = row * nk;
          const int64_t hi = std::clamp<int64_t>(q0 + q - k0 + 1, 0, nk);
          const int64_t lo = window > 0 ? std::clamp<int64_t>(q0 + q - k0 - window + 1, 0, hi) : 0;
          std::fill(out + off, out + off + lo, f);
          std::copy(in + off + lo, in + off + hi, out + off + lo);
          std::fill(out + off + hi, out + off + nk, f);
        }
      });
    });
  });
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
                  dispatch_float(g.dtype(), [&](auto zero) {
                    using T = decltype(zero);
                    T* out = reinterpret_cast<T*>(o);
                    std::fill(out, out + nv * ne, T(0));
                    const T* src = reinterpret_cast<const T*>(block(g, device));
                    for (int64_t i = 0; i < rows; ++i) {
                      const int64_t id = id_at(ids, device, i);
                      if (id < 0 || id >= vocab) bad_id("take", id, vocab);
                      if (id < v0 || id >= v0 + nv) continue;
                      T* row = out + (id - v0) * ne;
                      for (int64_t e = 0; e < ne; ++e) row[e] += src[i * ne + e];
                    }
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
                        for (int64_t a = 0; a < s.outer; ++a) std::memcpy(o + a * inner, src + (a * s.n + i) * inner, inner);
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

Tensor causal_mask(const Tensor& x, int64_t window) {
  check_float(x, "causal_mask");
  if (x.rank() < 2) throw ValueError("causal_mask needs [..., query, key], got " + x.to_string());
  if (window < 0) throw ValueError("causal_mask: the window must not be negative, got " + std::to_string(window));
  // MaxText's mask value: far below any score, yet finite so a fully masked row stays a number.
  const double fill = -0.7 * (x.dtype() == DType::kF32 ? std::numeric_limits<float>::max()
                                                        : std::numeric_limits<double>::max());
  return record(mask_raw(x, fill, window), {x},
                [window](const Tensor& g) { return std::vector<Tensor>{mask_raw(g, 0.0, window)}; });
}

namespace {

Tensor rope_styled(const Tensor& x, size_t seq_dim, const RopeStyle& style) {
  check_float(x, "rope");
  if (!(style.max_timescale > 0))
    throw ValueError("rope: max_timescale must be positive, got " + std::to_string(style.max_timescale));
  if (x.rank() < 3 || seq_dim + 2 >= x.rank() || x.shape()[x.rank() - 1] % 2 != 0) {
    throw ValueError("rope needs [..., seq, heads, head_dim] with seq before heads and an even head_dim, got " +
                     x.to_string());
  }
  return record(rope_raw(x, seq_dim, 1.0, style), {x}, [seq_dim, style](const Tensor& g) {
    return std::vector<Tensor>{rope_raw(g, seq_dim, -1.0, style)};
  });
}

}  // namespace

Tensor rope(const Tensor& x, size_t seq_dim, double max_timescale, double scale) {
  RopeStyle style;
  style.max_timescale = max_timescale;
  style.scale = scale;
  return rope_styled(x, seq_dim, style);
}

Tensor yarn_rope(const Tensor& x, size_t seq_dim, const YarnRope& yarn) {
  if (!(yarn.factor > 0) || !(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) || yarn.original_max_position < 1)
    throw ValueError("yarn_rope: factor, beta_fast, beta_slow and original_max_position must be positive");
  // attention_scaling multiplies in the rotation's pass: the same bits as after the reordering below.
  const double attention_scale = yarn.attention_scaling && yarn.factor > 1 ? 0.1 * std::log(yarn.factor) + 1.0 : 1.0;
  Tensor y = rope_styled(x, seq_dim,
                         {.max_timescale = yarn.max_timescale, .interleaved = yarn.interleave, .yarn = yarn,
                          .scale = attention_scale});
  if (yarn.interleave) {
    // Rotated pairs (2k, 2k+1) come out as MaxText's complex numbers do: real parts, then imaginary.
    const size_t r = y.rank();
    std::vector<int64_t> pairs(y.shape().dims().begin(), y.shape().dims().end());
    const int64_t d = pairs.back();
    pairs.back() = d / 2;
    pairs.push_back(2);
    std::vector<size_t> perm(r + 1);
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[r - 1], perm[r]);
    y = reshape(transpose(reshape(y, Shape(pairs)), perm), x.shape());
  }
  return y;
}

Tensor llama_rope(const Tensor& x, size_t seq_dim, double max_timescale, bool llama3_scaling) {
  RopeStyle style;
  style.max_timescale = max_timescale;
  style.interleaved = true;
  style.llama3_scaling = llama3_scaling;
  return rope_styled(x, seq_dim, style);
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
