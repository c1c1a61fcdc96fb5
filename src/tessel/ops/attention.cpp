#include "tessel/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rope_kernels.h"
#include "tessel/ops/detail/rope_tables.h"
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

// P = softmax(mask(q k^T)) for one head, its rows of q q_row apart, of k k_row.
template <class T>
void head_probabilities(const Layout& l, DType dt, const T* qi, int64_t q_row, const T* kj, int64_t k_row, T* pb) {
  l.for_query_blocks([&](int64_t r0, int64_t r1, int64_t lo, int64_t hi) {
    gemm_strided(dt, false, true, r1 - r0, hi - lo, l.d, bytes(qi + r0 * q_row), q_row, bytes(kj + lo * k_row), k_row,
                 bytes(pb + r0 * l.s + lo), l.s, false);
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

// Rotary embeddings applied as the op reads q and k (AttentionRope): the tables' rows for
// positions [0, s), turning forward (sin) and back (back_sin; cos is the same), and the queries'
// scale. Each rotation is rope's kernel on the same rows, so the bits are those of the rope ops.
template <class T>
struct Rotation {
  const T* cos;
  const T* sin;
  const T* back_sin;
  T query_scale;
};

// Rows [0, s) of one head, `from` rows from_row apart, rotated into `to` (rows to_row apart), scaled
// as rope_heads scales: after the rotation, or with `back` (the gradient) before it.
template <class T>
void rotate_rows(const Layout& l, const Rotation<T>& r, bool back, T scale, const T* from, int64_t from_row, T* to,
                 int64_t to_row) {
  rope_rows(from, from_row, to, to_row, r.cos, back ? r.back_sin : r.sin, l.s, l.d / 2, scale, back);
}

// One head's rows as the products read them: in place (rows `row` apart), or with a rotation
// rotated (and scaled) into `scratch` ([s, d], rows d apart).
template <class T>
struct HeadRows {
  const T* at;
  int64_t row;
};
template <class T>
HeadRows<T> head_rows(const Layout& l, const Rotation<T>* rot, T scale, const T* x, int64_t row, T* scratch) {
  if (!rot) return {x, row};
  rotate_rows(l, *rot, false, scale, x, row, scratch, l.d);
  return {scratch, l.d};
}

// The forward for batch row t and key/value head j: each head's probabilities, then its output
// rows while they are in cache. With a rotation, the head's queries and the pair's keys are
// rotated into `scratch` ([2, s, d]) first.
template <class T>
void forward_pair(const Layout& l, DType dt, const Rotation<T>* rot, const T* q, const T* k, const T* v, T* p, T* o,
                  T* scratch, int64_t t, int64_t j) {
  const HeadRows<T> kj = head_rows(l, rot, T(1), k + l.k_at(t, j), l.k_row(), scratch);
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const int64_t i = j * l.g + gi;
    const HeadRows<T> qi =
        head_rows(l, rot, rot ? rot->query_scale : T(1), q + l.q_at(t, i), l.q_row(), rot ? scratch + l.s * l.d : nullptr);
    T* pb = p + l.p_at(t, j, gi);
    head_probabilities(l, dt, qi.at, qi.row, kj.at, kj.row, pb);
    head_rows_times(l, dt, pb, v + l.v_at(t, j), l.v_row(), o + l.o_at(t, i), l.o_row(), l.dv);
  }
}

// The backward for batch row t and key/value head j, one head at a time with its score gradients
// in `scratch` ([s, s], in cache while dq and dk use them): dq, dk, dv where asked (nullptr
// otherwise). dk and dv sum the group's heads in order. With a rotation, `scratch` holds four
// [s, d] more after the scores: the pair's rotated keys, a head's rotated queries, its queries'
// gradient before it is rotated back into dq, and the keys' sum before it is rotated back into dk.
template <class T>
void backward_pair(const Layout& l, DType dt, const Rotation<T>* rot, const T* q, const T* k, const T* v, const T* p,
                   const T* go, T* dq, T* dk, T* dv, T* scratch, int64_t t, int64_t j) {
  // The rotation's parts of the scratch (with neither dq nor dk asked, there is no scratch).
  auto part = [&](int64_t at) { return rot && (dq || dk) ? scratch + l.s * l.s + at * l.s * l.d : nullptr; };
  T* ds = scratch;
  T* kr = part(0);
  T* qr = part(1);
  T* dqr = part(2);
  T* dkr = part(3);
  T* dkj = dk ? dk + l.k_at(t, j) : nullptr;
  T* dvj = dv ? dv + l.v_at(t, j) : nullptr;
  // Where dk's sum goes: dk itself, or (rotated) dkr.
  T* dk_sum = rot ? dkr : dkj;
  const int64_t dk_row = rot ? l.d : l.k_row();
  // The keys are read by dq's products only.
  const HeadRows<T> kj = dq ? head_rows(l, rot, T(1), k + l.k_at(t, j), l.k_row(), kr) : HeadRows<T>{};
  for (int64_t pos = 0; pos < l.s; ++pos) {
    if (dkj) std::fill_n(dk_sum + pos * dk_row, l.d, T(0));
    if (dvj) std::fill_n(dvj + pos * l.v_row(), l.dv, T(0));
  }
  for (int64_t gi = 0; gi < l.g; ++gi) {
    const int64_t i = j * l.g + gi;
    const T* pb = p + l.p_at(t, j, gi);
    const T* go_i = go + l.o_at(t, i);
    if (dq || dk) {
      head_score_grads(l, dt, pb, v + l.v_at(t, j), go_i, ds);
      if (dq) {
        T* dqi = dq + l.q_at(t, i);
        if (rot) {
          head_rows_times(l, dt, static_cast<const T*>(ds), kj.at, kj.row, dqr, l.d, l.d);
          rotate_rows(l, *rot, true, rot->query_scale, static_cast<const T*>(dqr), l.d, dqi, l.q_row());
        } else {
          head_rows_times(l, dt, static_cast<const T*>(ds), kj.at, kj.row, dqi, l.q_row(), l.d);
        }
      }
      if (dk) {
        const HeadRows<T> qi = head_rows(l, rot, rot ? rot->query_scale : T(1), q + l.q_at(t, i), l.q_row(), qr);
        head_key_grads(l, dt, static_cast<const T*>(ds), qi.at, qi.row, dk_sum, dk_row, l.d);
      }
    }
    if (dv) head_key_grads(l, dt, pb, go_i, l.o_row(), dvj, l.v_row(), l.dv);
  }
  if (rot && dkj) rotate_rows(l, *rot, true, T(1), static_cast<const T*>(dkr), l.d, dkj, l.k_row());
}

// The rotation tables of an AttentionRope for s positions of heads of d, as f32 and f64.
struct RotationTables {
  std::shared_ptr<const RopeTable<float>> f32, f32_back;
  std::shared_ptr<const RopeTable<double>> f64, f64_back;
  double query_scale = 1;

  template <class T>
  Rotation<T> get() const {
    if constexpr (std::is_same_v<T, float>) {
      return {f32->cos.data(), f32->sin.data(), f32_back->sin.data(), static_cast<float>(query_scale)};
    } else {
      return {f64->cos.data(), f64->sin.data(), f64_back->sin.data(), query_scale};
    }
  }
};

RotationTables rotation_tables(WorkerPool& pool, DType dt, int64_t s, int64_t d, const AttentionRope& rope) {
  const std::vector<double> freq = default_rope_frequencies(rope.max_timescale, d);
  RotationTables t;
  t.query_scale = rope.query_scale;
  if (dt == DType::kF32) {
    t.f32 = rope_table<float>(pool, s, freq, 1.0);
    t.f32_back = rope_table<float>(pool, s, freq, -1.0);
  } else {
    t.f64 = rope_table<double>(pool, s, freq, 1.0);
    t.f64_back = rope_table<double>(pool, s, freq, -1.0);
  }
  return t;
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

namespace {

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t window, const AttentionRope* rope) {
  check_attention_shapes(q_in, k_in, v_in);
  if (window < 0) throw ValueError("causal_attention: the window must not be negative, got " + std::to_string(window));
  const int64_t b = q_in.shape()[0], s = q_in.shape()[1], h = q_in.shape()[2], d = q_in.shape()[3];
  if (rope) {
    if (!(rope->max_timescale > 0) || !std::isfinite(rope->max_timescale))
      throw ValueError("causal_attention: rope's max_timescale must be positive, got " + std::to_string(rope->max_timescale));
    if (!std::isfinite(rope->query_scale))
      throw ValueError("causal_attention: rope's query_scale must be finite, got " + std::to_string(rope->query_scale));
    if (d % 2 != 0)
      throw ValueError("causal_attention: rope pairs the halves of head_dim, which must be even, got " + q_in.to_string());
  }
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
  const bool rotates = rope != nullptr;
  const RotationTables tables = rotates && !q.is_abstract()
                                    ? rotation_tables(q.shards().runtime().pool(), dt, s, d, *rope)
                                    : RotationTables{};
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
          using T = decltype(zero);
          const Rotation<T> rot = rotates ? tables.get<T>() : Rotation<T>{};
          for_pairs<T>(l, rotates ? 2 * s * d : 0, [&](int64_t t, int64_t j, T* scratch) {
            forward_pair(l, dt, rotates ? &rot : nullptr, in(q, device, zero), in(k, device, zero), in(v, device, zero),
                         as(outs[0], zero), as(outs[1], zero), scratch, t, j);
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
            const Rotation<T> rot = rotates ? tables.get<T>() : Rotation<T>{};
            // The scratch: one head's score gradients, and with a rotation four [s, d] more.
            const int64_t scratch = nq || nk ? l.s * l.s + (rotates ? 4 * l.s * l.d : 0) : 0;
            for_pairs<T>(l, scratch, [&](int64_t t, int64_t j, T* ds) {
              backward_pair(l, dt, rotates ? &rot : nullptr, in(q, device, zero), in(k, device, zero), in(v, device, zero),
                            in(p, device, zero), in(go, device, zero), dq, dk, dvb, ds, t, j);
            });
          });
        });
    size_t next = 0;
    Tensor dq = nq ? grads[next++] : Tensor(), dk = nk ? grads[next++] : Tensor(), dvt = nv ? grads[next++] : Tensor();
    return std::vector<Tensor>{dq, dk, dvt};
  });
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window) {
  return attention(q, k, v, window, nullptr);
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window, const AttentionRope& rope) {
  return attention(q, k, v, window, &rope);
}

}  // namespace tessel::ops
