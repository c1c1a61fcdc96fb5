// Classification losses: softmax cross-entropy against integer labels, fused over an unsplit class
// dimension (one pass per row forward and one backward), composite when the classes are split.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/detail/ids.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rows.h"
#include "tessel/ops/detail/vmath.h"
#include "tessel/ops/ops.h"

namespace tessel::ops {

using namespace detail;

namespace {

constexpr const char* kOp = "softmax_cross_entropy_with_integer_labels";

// A row's shifted exponentials e = exp(x - max) into `e`, their maximum and their sum, with the
// composite log_softmax's kernels (exp_f32, row_sums_f32, a left-to-right f64 sum), so that the
// loss has its bits.
template <class T>
void shifted_exp(const T* x, int64_t n, T* e, T& m, T& z) {
  m = reduce_lanes(n, -std::numeric_limits<T>::infinity(), [x](int64_t i) { return x[i]; },
                   [](T a, T b) { return std::max(a, b); });
  for (int64_t i = 0; i < n; ++i) e[i] = x[i] - m;
  if constexpr (std::is_same_v<T, float>) {
    exp_f32(e, e, n);
    row_sums_f32(e, &z, 1, n);
  } else {
    z = 0;
    for (int64_t i = 0; i < n; ++i) {
      e[i] = std::exp(e[i]);
      z += e[i];
    }
  }
}

// fn(device, out, row_lo, row_hi, classes, labels) over the rows of each device's block of an
// output of `shape` and `sharding`, spread over the cores; `labels` placed like the rows.
template <class Fn>
Tensor per_rows(const Tensor& logits, const Tensor& labels, const Shape& shape, const NamedSharding& sharding, Fn fn) {
  const int64_t classes = logits.shape()[logits.rank() - 1];
  return output(logits, shape, logits.dtype(), sharding, {}, [&](int64_t device, const Box&, std::byte* o) {
    const int64_t rows = block_box(labels, device).volume();
    split_range(rows, 16, [&](int64_t lo, int64_t hi) {
      dispatch_float(logits.dtype(), [&](auto zero) {
        using T = decltype(zero);
        fn(device, reinterpret_cast<T*>(o), reinterpret_cast<const T*>(block(logits, device)), lo, hi, classes);
      });
    });
  });
}

}  // namespace

Tensor softmax_cross_entropy_with_integer_labels(const Tensor& logits_in, const Tensor& labels_in) {
  check_ids(labels_in, kOp);
  check_float(logits_in, kOp);
  const size_t r = logits_in.rank();
  if (r < 1) throw ValueError(std::string(kOp) + ": logits need a class dimension: " + logits_in.to_string());
  if (labels_in.rank() + 1 != r ||
      !std::equal(labels_in.shape().dims().begin(), labels_in.shape().dims().end(), logits_in.shape().dims().begin())) {
    throw ValueError(std::string(kOp) + ": labels " + labels_in.to_string() + " do not match the leading dimensions of " +
                     logits_in.to_string());
  }
  const Tensor logits = reduce_raw(logits_in, nullptr);
  if (!last_dim_whole(logits)) {  // classes split over devices: the composite's sums cross them
    return neg(sum(mul(log_softmax(logits_in, r - 1), one_hot(labels_in, logits_in)), r - 1));
  }
  const Dims d = dims_of(logits.sharding(), r);
  const NamedSharding rows_sharding = with_dims(logits.mesh(), Dims(d.begin(), d.end() - 1));
  const Tensor labels = reshard_raw(labels_in, rows_sharding);
  // -log p[label] = log(z) - (x[label] - max), as the composite's neg(sum(log_softmax * one_hot)).
  Tensor loss = per_rows(logits, labels, labels.shape(), rows_sharding,
                         [&](int64_t device, auto* out, const auto* x, int64_t lo, int64_t hi, int64_t n) {
    using T = std::remove_pointer_t<decltype(out)>;
    std::vector<T> e(static_cast<size_t>(n));
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t id = id_at(labels, device, row);
      if (id < 0 || id >= n) bad_id(kOp, id, n);
      const T* xr = x + row * n;
      T m, z;
      shifted_exp(xr, n, e.data(), m, z);
      out[row] = -((xr[id] - m) - static_cast<T>(std::log(z)));
    }
  });
  return record(loss, {logits_in}, [logits, labels](const Tensor& g_in) {
    const Tensor g = reshard_raw(reduce_raw(g_in, nullptr), labels.sharding());
    // d loss / d x = g * (softmax(x) - one_hot(label)).
    Tensor dx = per_rows(logits, labels, logits.shape(), logits.sharding(),
                         [&](int64_t device, auto* out, const auto* x, int64_t lo, int64_t hi, int64_t n) {
      using T = std::remove_pointer_t<decltype(out)>;
      const T* gr = reinterpret_cast<const T*>(block(g, device));
      for (int64_t row = lo; row < hi; ++row) {
        T* o = out + row * n;
        T m, z;
        shifted_exp(x + row * n, n, o, m, z);
        const T scale = gr[row] / z;
        for (int64_t i = 0; i < n; ++i) o[i] *= scale;
        o[id_at(labels, device, row)] -= gr[row];
      }
    });
    return std::vector<Tensor>{dx};
  });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  return mean(softmax_cross_entropy_with_integer_labels(logits, labels));
}

}  // namespace tessel::ops
