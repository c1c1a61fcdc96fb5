#include "tessel/ops/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rows.h"
#include "tessel/ops/detail/softmax_kernels.h"

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

// fn(t, j, scratch) for every (batch row, key/value head) of the device, spread over the cores
// when the op runs fewer blocks than cores; `scratch` holds `scratch_size` elements of T, one
// buffer for each core's pairs.
template <class T, class Fn>
void for_pairs(const Layout& l, int64_t scratch_size, Fn&& fn) {
  split_range(l.batch * l.kv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> scratch(static_cast<size_t>(scratch_size));
    for (int64_t x = lo; x < hi; ++x) fn(x / l.kv, x % l.kv, scratch.data());
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

// Each row p of a block of queries [r0, r1) over the keys [lo, r1) its products read: zeros at
// the keys outside [first_key(p), p], where fn(row + first, visible) runs. Keys outside [lo, r1)
// are never read, and never written.
template <class T, class Fn>
void visible_rows(const Layout& l, T* block, int64_t r0, int64_t r1, int64_t lo, Fn&& fn) {
  for (int64_t p = r0; p < r1; ++p) {
    T* row = block + p * l.s;
    const int64_t first = first_key(p, l.window);
    std::fill(row + lo, row + first, T(0));
    fn(row + first, p + 1 - first);
    std::fill(row + p + 1, row + r1, T(0));
  }
}

// The per-head steps below take one head's blocks: its probabilities (or score gradients) `pb`,
// [s, s]; its rows of q, dq, o or do (rows q_row or o_row apart); the rows of its key/value head in
// k, v, dk or dv (k_row or v_row apart).

// P = softmax(mask(q k^T)) for one head.
template <class T>
void head_probabilities(const Layout& l, DType dt, const T* qi, const T* kj, T* pb) {
  l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
    gemm_strided(dt, false, true, r1 - r0, hi - lo, l.d, bytes(qi + r0 * l.q_row()), l.q_row(), bytes(kj + lo * l.k_row()),
                 l.k_row(), bytes(pb + r0 * l.s + lo), l.s, false);
    visible_rows(l, pb, r0, r1, lo, [](T* row, int64_t n) { softmax_rows(row, row, 1, n); });
  });
}

// out = w x for one head: o (w = P, x = v, width dv) or dq (w = dS, x = k, width d). Rows of x are
// x_row apart, of out out_row.
template <class T>
void head_rows_times(const Layout& l, DType dt, const T* wb, const T* xj, int64_t x_row, T* oi, int64_t out_row,
                     int64_t width) {
  l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
    gemm_strided(dt, false, false, r1 - r0, width, hi - lo, bytes(wb + r0 * l.s + lo), l.s, bytes(xj + lo * x_row),
                 x_row, bytes(oi + r0 * out_row), out_row, false);
  });
}

// dS = P * (dP - rowsum(dP * P)) with dP = do v^T: the gradient of one head's scores (zero where
// masked).
template <class T>
void head_score_grads(const Layout& l, DType dt, const T* pb, const T* vj, const T* go_i, T* db) {
  l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
    gemm_strided(dt, false, true, r1 - r0, hi - lo, l.dv, bytes(go_i + r0 * l.o_row()), l.o_row(),
                 bytes(vj + lo * l.v_row()), l.v_row(), bytes(db + r0 * l.s + lo), l.s, false);
    visible_rows(l, db, r0, r1, lo, [&](T* row, int64_t n) {
      const T* prob = pb + (row - db);
      softmax_grad_rows(prob, row, row, 1, n);
    });
  });
}

// out[keys] += w^T x over one head's query blocks, in order: dk (w = dS, x = q, width d) or dv
// (w = P, x = do, width dv).
template <class T>
void head_key_grads(const Layout& l, DType dt, const T* wb, const T* xi, int64_t x_row, T* out, int64_t out_row,
                    int64_t width) {
  l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
    gemm_strided(dt, true, false, hi - lo, width, r1 - r0, bytes(wb + r0 * l.s + lo), l.s, bytes(xi + r0 * x_row),
                 x_row, bytes(out + lo * out_row), out_row, true);
  });
}

// The forward for batch row t and key/value head j: each head's probabilities, then its output
// rows while they are in cache.
template <class T>
void forward_pair(const Layout& l, DType dt, const T* q, const T* k, const T* v, T* p, T* o, int64_t t, int64_t j) {
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const int64_t i = j * l.g + gi;
    T* pb = p + l.p_at(t, j, gi);
    head_probabilities(l, dt, q + l.q_at(t, i), k + l.k_at(t, j), pb);
    head_rows_times(l, dt, pb, v + l.v_at(t, j), l.v_row(), o + l.o_at(t, i), l.o_row(), l.dv);
  }
}

// The backward for batch row t and key/value head j, one head at a time with its score gradients
// in `ds` ([s, s] scratch, in cache while dq and dk use them): dq, dk, dv where asked (nullptr
// otherwise). dk and dv sum the group's heads in order.
template <class T>
void backward_pair(const Layout& l, DType dt, const T* q, const T* k, const T* v, const T* p, const T* go, T* dq,
                   T* dk, T* dv, T* ds, int64_t t, int64_t j) {
  T* dkj = dk ? dk + l.k_at(t, j) : nullptr;
  T* dvj = dv ? dv + l.v_at(t, j) : nullptr;
  for (int64_t pos = 0; pos < l.s; ++pos) {
    if (dkj) std::fill_n(dkj + pos * l.k_row(), l.d, T(0));
    if (dvj) std::fill_n(dvj + pos * l.v_row(), l.dv, T(0));
  }
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const int64_t i = j * l.g + gi;
    const T* pb = p + l.p_at(t, j, gi);
    const T* go_i = go + l.o_at(t, i);
    if (dq || dk) {
      head_score_grads(l, dt, pb, v + l.v_at(t, j), go_i, ds);
      if (dq) head_rows_times(l, dt, static_cast<const T*>(ds), k + l.k_at(t, j), l.k_row(), dq + l.q_at(t, i), l.q_row(), l.d);
      if (dk) head_key_grads(l, dt, static_cast<const T*>(ds), q + l.q_at(t, i), l.q_row(), dkj, l.k_row(), l.d);
    }
    if (dv) head_key_grads(l, dt, pb, go_i, l.o_row(), dvj, l.v_row(), l.dv);
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
  // A device's layout from its block of an array whose dimension 2 counts `per_kv` of each
  // key/value head: q, dq and o (g), k, v, dk and dv (1).
  auto layout = [=](const Box& box, int64_t per_kv) {
    return Layout{box.extent(0), s, box.extent(2) / per_kv, g, d, dv, window};
  };
  // A device's block of x as T.
  auto in = [](const Tensor& x, int64_t device, auto zero) {
    return reinterpret_cast<const decltype(zero)*>(block(x, device));
  };
  auto as = [](std::byte* out, auto zero) { return reinterpret_cast<decltype(zero)*>(out); };

  // The probabilities (kept for the backward) and the output, each head's in one go.
  const std::vector<Tensor> p_and_o = outputs(
      q, {{probs_shape, probs_sharding}, {Shape{b, s, h, dv}, in_sharding}}, dt,
      [&](int64_t device, const std::vector<Box>& boxes, const std::vector<std::byte*>& outs) {
        const Layout l = layout(boxes[1], g);
        dispatch_float(dt, [&](auto zero) {
          for_pairs<decltype(zero)>(l, 0, [&](int64_t t, int64_t j, auto*) {
            forward_pair(l, dt, in(q, device, zero), in(k, device, zero), in(v, device, zero), as(outs[0], zero),
                         as(outs[1], zero), t, j);
          });
        });
      });
  const Tensor& p = p_and_o[0];

  return record(p_and_o[1], {q_in, k_in, v_in}, [=, nq = needs(q_in), nk = needs(k_in), nv = needs(v_in)](const Tensor& g_in) {
    const Tensor go = reshard_raw(reduce_raw(g_in, nullptr), in_sharding);
    // The gradients asked for, each (batch row, key/value head) pair's in one go.
    std::vector<OutputLayout> wanted;
    if (nq) wanted.push_back({q.shape(), in_sharding});
    if (nk) wanted.push_back({k.shape(), in_sharding});
    if (nv) wanted.push_back({v.shape(), in_sharding});
    if (wanted.empty()) return std::vector<Tensor>{Tensor(), Tensor(), Tensor()};
    const std::vector<Tensor> grads = outputs(
        q, wanted, dt, [&](int64_t device, const std::vector<Box>& boxes, const std::vector<std::byte*>& outs) {
          const Layout l = layout(boxes[0], nq ? g : 1);
          dispatch_float(dt, [&](auto zero) {
            using T = decltype(zero);
            size_t next = 0;
            T* dq = nq ? as(outs[next++], zero) : nullptr;
            T* dk = nk ? as(outs[next++], zero) : nullptr;
            T* dvb = nv ? as(outs[next++], zero) : nullptr;
            // The scratch: one head's score gradients.
            for_pairs<T>(l, nq || nk ? l.s * l.s : 0, [&](int64_t t, int64_t j, T* ds) {
              backward_pair(l, dt, in(q, device, zero), in(k, device, zero), in(v, device, zero), in(p, device, zero),
                            in(go, device, zero), dq, dk, dvb, ds, t, j);
            });
          });
        });
    size_t next = 0;
    Tensor dq = nq ? grads[next++] : Tensor(), dk = nk ? grads[next++] : Tensor(), dvt = nv ? grads[next++] : Tensor();
    return std::vector<Tensor>{dq, dk, dvt};
  });
}

}  // namespace tessel::ops
