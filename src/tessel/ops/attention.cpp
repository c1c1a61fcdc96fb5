#include "tessel/ops/attention.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rows.h"

namespace tessel::ops {

using namespace detail;

namespace {

// Queries per block: the scores of one block are a [64, keys it sees] slab of the probabilities,
// one product against the keys up to the block's last query (a quarter of a 128-long causal square
// is never computed, nearly half of a long one).
constexpr int64_t kQueryBlock = 64;

// The first key that query `p` sees.
int64_t first_key(int64_t p, int64_t window) { return window > 0 ? std::max<int64_t>(0, p - window + 1) : 0; }

// One device's blocks: its batch rows and key/value heads (its query heads are kv * g, head i
// attending with key/value head i / g), in the layouts q [batch, s, heads, d], k [batch, s, kv, d],
// v [batch, s, kv, dv], o [batch, s, heads, dv] and probabilities [batch, kv, g, s, s]. Offsets are
// in elements.
struct Layout {
  int64_t batch, s, kv, g, d, dv, window;

  int64_t q_row() const { return kv * g * d; }  // from one position to the next, in q and dq
  int64_t k_row() const { return kv * d; }
  int64_t v_row() const { return kv * dv; }
  int64_t o_row() const { return kv * g * dv; }
  int64_t q_at(int64_t t, int64_t i) const { return t * s * q_row() + i * d; }  // head i, position 0
  int64_t k_at(int64_t t, int64_t j) const { return t * s * k_row() + j * d; }
  int64_t v_at(int64_t t, int64_t j) const { return t * s * v_row() + j * dv; }
  int64_t o_at(int64_t t, int64_t i) const { return t * s * o_row() + i * dv; }
  int64_t p_at(int64_t t, int64_t j, int64_t gi) const { return ((t * kv + j) * g + gi) * s * s; }

  // fn(r0, r1, lo, hi) for each block of queries [r0, r1) and the keys [lo, hi) they see.
  template <class Fn>
  void for_query_blocks(Fn&& fn) const {
    for (int64_t r0 = 0; r0 < s; r0 += kQueryBlock) {
      const int64_t r1 = std::min(s, r0 + kQueryBlock);
      fn(r0, r1, first_key(r0, window), r1);
    }
  }
};

// fn(t, j) for every (batch row, key/value head) of the device, spread over the cores when the op
// runs fewer blocks than cores.
void for_pairs(const Layout& l, const std::function<void(int64_t t, int64_t j)>& fn) {
  split_range(l.batch * l.kv, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t x = lo; x < hi; ++x) fn(x / l.kv, x % l.kv);
  });
}

template <class T>
const std::byte* bytes(const T* p) {
  return reinterpret_cast<const std::byte*>(p);
}
template <class T>
std::byte* bytes(T* p) {
  return reinterpret_cast<std::byte*>(p);
}

// Each row p of a probability block: zeros outside the keys [first_key(p), p], where fn(row + first,
// visible) runs.
template <class T, class Fn>
void visible_rows(const Layout& l, T* block, int64_t r0, int64_t r1, Fn&& fn) {
  for (int64_t p = r0; p < r1; ++p) {
    T* row = block + p * l.s;
    const int64_t first = first_key(p, l.window);
    std::fill(row, row + first, T(0));
    fn(row + first, p + 1 - first);
    std::fill(row + p + 1, row + l.s, T(0));
  }
}

// P = softmax(mask(q k^T)) for batch row t and key/value head j.
template <class T>
void probabilities(const Layout& l, DType dt, const T* q, const T* k, T* p, int64_t t, int64_t j) {
  for (int64_t gi = 0; gi < l.g; ++gi) {
    T* pb = p + l.p_at(t, j, gi);
    const T* qi = q + l.q_at(t, j * l.g + gi);
    l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
      gemm_strided(dt, false, true, r1 - r0, hi - lo, l.d, bytes(qi + r0 * l.q_row()), l.q_row(),
                   bytes(k + l.k_at(t, j) + lo * l.k_row()), l.k_row(), bytes(pb + r0 * l.s + lo), l.s, false);
      visible_rows(l, pb, r0, r1, [](T* row, int64_t n) { softmax_rows(row, row, 1, n); });
    });
  }
}

// out[queries of head i] = w x for every head i of the group of key/value head j: o (w = P,
// x = v, width dv) or dq (w = dS, x = k, width d). Rows of x are x_row apart, of out out_row.
template <class T>
void rows_times(const Layout& l, DType dt, const T* w, const T* x, int64_t x_row, T* out, int64_t out_row,
                int64_t width, int64_t t, int64_t j) {
  const T* xj = x + t * l.s * x_row + j * width;
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const T* wb = w + l.p_at(t, j, gi);
    T* oi = out + t * l.s * out_row + (j * l.g + gi) * width;
    l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
      gemm_strided(dt, false, false, r1 - r0, width, hi - lo, bytes(wb + r0 * l.s + lo), l.s, bytes(xj + lo * x_row),
                   x_row, bytes(oi + r0 * out_row), out_row, false);
    });
  }
}

// dS = P * (dP - rowsum(dP * P)) with dP = do v^T: the gradient of the scores (zero where masked).
template <class T>
void score_grads(const Layout& l, DType dt, const T* p, const T* v, const T* go, T* ds, int64_t t, int64_t j) {
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const T* pb = p + l.p_at(t, j, gi);
    T* db = ds + l.p_at(t, j, gi);
    const T* gi_rows = go + l.o_at(t, j * l.g + gi);
    l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
      gemm_strided(dt, false, true, r1 - r0, hi - lo, l.dv, bytes(gi_rows + r0 * l.o_row()), l.o_row(),
                   bytes(v + l.v_at(t, j) + lo * l.v_row()), l.v_row(), bytes(db + r0 * l.s + lo), l.s, false);
      visible_rows(l, db, r0, r1, [&](T* row, int64_t n) {
        const T* prob = pb + (row - db);
        softmax_grad_rows(prob, row, row, 1, n);
      });
    });
  }
}

// out[keys] = sum over the group's heads and query blocks of w^T x, for the key/value head j:
// dk (w = dS, x = q, width d) or dv (w = P, x = do, width dv). The order of the sums is fixed.
template <class T>
void key_grads(const Layout& l, DType dt, const T* w, const T* x, int64_t x_row, int64_t x_head, T* out,
               int64_t out_row, int64_t width, int64_t t, int64_t j) {
  out += t * l.s * out_row + j * width;
  for (int64_t pos = 0; pos < l.s; ++pos) std::fill_n(out + pos * out_row, width, T(0));
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const T* wb = w + l.p_at(t, j, gi);
    const T* xi = x + t * l.s * x_row + (j * l.g + gi) * x_head;
    l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
      gemm_strided(dt, true, false, hi - lo, width, r1 - r0, bytes(wb + r0 * l.s + lo), l.s, bytes(xi + r0 * x_row),
                   x_row, bytes(out + lo * out_row), out_row, true);
    });
  }
}

}  // namespace

void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_operands(q, k, "causal_attention");
  check_operands(q, v, "causal_attention");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || k.shape()[0] != q.shape()[0] ||
      k.shape()[1] != q.shape()[1] || k.shape()[3] != q.shape()[3] || k.shape()[2] == 0 ||
      q.shape()[2] % k.shape()[2] != 0 || v.shape()[0] != k.shape()[0] || v.shape()[1] != k.shape()[1] ||
      v.shape()[2] != k.shape()[2])
    throw ValueError("causal_attention: needs q [b, s, h, d], k [b, s, kv, d] and v [b, s, kv, dv] with kv dividing h, "
                     "got " + q.to_string() + ", " + k.to_string() + ", " + v.to_string());
}

Tensor causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t window) {
  check_attention_shapes(q_in, k_in, v_in);
  if (window < 0) throw ValueError("causal_attention: the window must not be negative, got " + std::to_string(window));
  const int64_t b = q_in.shape()[0], s = q_in.shape()[1], h = q_in.shape()[2], d = q_in.shape()[3];
  const int64_t kv = k_in.shape()[2], g = h / kv, dv = v_in.shape()[3];
  const Tensor q0 = reduce_raw(q_in, nullptr), k0 = reduce_raw(k_in, nullptr), v0 = reduce_raw(v_in, nullptr);
  const Mesh& mesh = q0.mesh();
  // The queries' batch and head splits; heads only where the split divides the key/value heads
  // too, so that every device holds whole groups. Sequence and head dimensions whole.
  const Dims qd = dims_of(q0.sharding(), 4);
  const DimSharding batch = qd[0];
  DimSharding heads = minus(qd[2], batch);
  if (kv % blocks_of(mesh, heads) != 0) heads = {};
  const NamedSharding in_sharding = with_dims(mesh, Dims{batch, {}, heads, {}});
  const NamedSharding probs_sharding = with_dims(mesh, Dims{batch, heads, {}, {}, {}});
  const Tensor q = reshard_raw(q0, in_sharding).with_node(nullptr);
  const Tensor k = reshard_raw(k0, in_sharding).with_node(nullptr);
  const Tensor v = reshard_raw(v0, in_sharding).with_node(nullptr);
  const DType dt = q.dtype();
  const Shape probs_shape{b, kv, g, s, s};
  // A device's layout from its block of an array whose dimension `heads_dim` counts `per_kv` of
  // each key/value head: the probabilities (1, 1), q, dq and o (2, g), k, v, dk and dv (2, 1).
  auto layout = [=](const Box& box, size_t heads_dim, int64_t per_kv) {
    return Layout{box.extent(0), s, box.extent(heads_dim) / per_kv, g, d, dv, window};
  };
  // fn(layout, device, out, t, j, zero) for every (batch row, key/value head) of each device's
  // block, out the block as T* (T the type of `zero`).
  auto per_pair = [=](const Shape& shape, const NamedSharding& sharding, size_t heads_dim, int64_t per_kv, auto fn) {
    return output(q, shape, dt, sharding, {}, [&](int64_t device, const Box& box, std::byte* out) {
      const Layout l = layout(box, heads_dim, per_kv);
      for_pairs(l, [&](int64_t t, int64_t j) {
        dispatch_float(dt, [&](auto zero) { fn(l, device, reinterpret_cast<decltype(zero)*>(out), t, j, zero); });
      });
    });
  };
  // A device's block of x as T.
  auto in = [](const Tensor& x, int64_t device, auto zero) {
    return reinterpret_cast<const decltype(zero)*>(block(x, device));
  };

  const Tensor p = per_pair(probs_shape, probs_sharding, 1, 1, [&](const Layout& l, int64_t device, auto* out,
                                                                       int64_t t, int64_t j, auto zero) {
    probabilities(l, dt, in(q, device, zero), in(k, device, zero), out, t, j);
  });
  const Tensor o = per_pair(Shape{b, s, h, dv}, in_sharding, 2, g, [&](const Layout& l, int64_t device, auto* out,
                                                                          int64_t t, int64_t j, auto zero) {
    rows_times(l, dt, in(p, device, zero), in(v, device, zero), l.v_row(), out, l.o_row(), l.dv, t, j);
  });

  return record(o, {q_in, k_in, v_in}, [=, nq = needs(q_in), nk = needs(k_in), nv = needs(v_in)](const Tensor& g_in) {
    const Tensor go = reshard_raw(reduce_raw(g_in, nullptr), in_sharding);
    Tensor dq, dk, dvt;
    if (nq || nk) {
      const Tensor ds = per_pair(probs_shape, probs_sharding, 1, 1, [&](const Layout& l, int64_t device, auto* out,
                                                                            int64_t t, int64_t j, auto zero) {
        score_grads(l, dt, in(p, device, zero), in(v, device, zero), in(go, device, zero), out, t, j);
      });
      if (nq) {
        dq = per_pair(q.shape(), in_sharding, 2, g, [&](const Layout& l, int64_t device, auto* out, int64_t t,
                                                             int64_t j, auto zero) {
          rows_times(l, dt, in(ds, device, zero), in(k, device, zero), l.k_row(), out, l.q_row(), l.d, t, j);
        });
      }
      if (nk) {
        dk = per_pair(k.shape(), in_sharding, 2, 1, [&](const Layout& l, int64_t device, auto* out, int64_t t,
                                                             int64_t j, auto zero) {
          key_grads(l, dt, in(ds, device, zero), in(q, device, zero), l.q_row(), l.d, out, l.k_row(), l.d, t, j);
        });
      }
    }
    if (nv) {
      dvt = per_pair(v.shape(), in_sharding, 2, 1, [&](const Layout& l, int64_t device, auto* out, int64_t t,
                                                            int64_t j, auto zero) {
        key_grads(l, dt, in(p, device, zero), in(go, device, zero), l.o_row(), l.dv, out, l.v_row(), l.dv, t, j);
      });
    }
    return std::vector<Tensor>{dq, dk, dvt};
  });
}

}  // namespace tessel::ops
