// Batched matrix products (dot_general with batch dimensions first, as attention needs them).
#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel::ops {

using namespace detail;

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  check_operands(a_in, b_in, "matmul");
  const size_t r = a_in.rank();
  const size_t am = trans_a ? r - 1 : r - 2, ak = trans_a ? r - 2 : r - 1;
  const size_t bk = trans_b ? r - 1 : r - 2, bn = trans_b ? r - 2 : r - 1;
  if (r < 2 || b_in.rank() != r ||
      !std::equal(a_in.shape().dims().begin(), a_in.shape().dims().end() - 2, b_in.shape().dims().begin()) ||
      a_in.shape()[ak] != b_in.shape()[bk]) {
    throw ValueError("matmul: shapes do not contract: " + a_in.to_string() + (trans_a ? " (transposed)" : "") +
                     " and " + b_in.to_string() + (trans_b ? " (transposed)" : ""));
  }
  const Tensor a0 = reduce_raw(a_in, nullptr), b0 = reduce_raw(b_in, nullptr);
  const Mesh& mesh = a0.mesh();
  const Dims ad = dims_of(a0.sharding(), r), bd = dims_of(b0.sharding(), r);
  // Batch dimensions split like a, else like b; then m like a, n like b; each mesh axis once.
  Dims out(r);
  Axes used;
  for (size_t i = 0; i + 2 < r; ++i) {
    out[i] = disjoint(ad[i], used) ? ad[i] : (disjoint(bd[i], used) ? bd[i] : DimSharding{});
    used = united(used, out[i]);
  }
  out[r - 2] = minus(ad[am], used);
  used = united(used, out[r - 2]);
  out[r - 1] = minus(bd[bn], used);
  used = united(used, out[r - 1]);
  // The contraction: split like a, like b, or not at all, whichever moves the fewest bytes (a
  // split leaves a partial sum whose reduction costs about twice the output block).
  int64_t out_block = static_cast<int64_t>(item_size(a0.dtype()));
  for (size_t i = 0; i < r; ++i) {
    const int64_t extent = i == r - 2 ? a0.shape()[am] : (i == r - 1 ? b0.shape()[bn] : a0.shape()[i]);
    out_block *= (extent + blocks_of(mesh, out[i]) - 1) / blocks_of(mesh, out[i]);
  }
  Dims best_a, best_b;
  DimSharding best_k;
  int64_t best_cost = -1;
  for (const DimSharding& k : {ad[ak], bd[bk], DimSharding{}}) {
    if (!disjoint(k, used)) continue;
    Dims na = out, nb = out;
    na[am] = out[r - 2];
    na[ak] = k;
    nb[bk] = k;
    nb[bn] = out[r - 1];
    const int64_t cost = redistribution_bytes(a0, ad, na) + redistribution_bytes(b0, bd, nb) +
                         (k.empty() ? 0 : 2 * out_block);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_a = na;
      best_b = nb;
      best_k = k;
    }
  }
  const Tensor a = reshard_raw(a0, with_dims(mesh, best_a));
  const Tensor b = reshard_raw(b0, with_dims(mesh, best_b));
  std::vector<int64_t> dims(a.shape().dims().begin(), a.shape().dims().end() - 2);
  dims.push_back(a.shape()[am]);
  dims.push_back(b.shape()[bn]);
  Axes partial = best_k;
  std::sort(partial.begin(), partial.end());
  const int64_t item = static_cast<int64_t>(item_size(a.dtype()));
  Tensor result = output(a, Shape(dims), a.dtype(), with_dims(mesh, out), partial,
                         [&](int64_t device, const Box& box, std::byte* o) {
                           if (box.volume() == 0) return;
                           const int64_t m = box.extent(r - 2), n = box.extent(r - 1);
                           const int64_t k = block_box(a, device).extent(ak);
                           const int64_t batches = box.volume() / (m * n);
                           const std::byte* pa = block(a, device);
                           const std::byte* pb = block(b, device);
                           auto run = [&](int64_t lo, int64_t hi) {
                             for (int64_t t = lo; t < hi; ++t) {
                               gemm(a.dtype(), trans_a, trans_b, m, n, k, pa + t * m * k * item,
                                    pb + t * k * n * item, o + t * m * n * item, false);
                             }
                           };
                           // Many small products (attention heads): whole products per core.
                           if (batches >= spread()) {
                             split_range(batches, 1, run);
                           } else {
                             run(0, batches);
                           }
                         });
  return record(result, {a_in, b_in}, [a_in, b_in, trans_a, trans_b](const Tensor& g) {
    Tensor da, db;
    if (needs(a_in)) da = trans_a ? matmul(b_in, g, trans_b, true) : matmul(g, b_in, false, !trans_b);
    if (needs(b_in)) db = trans_b ? matmul(g, a_in, true, trans_a) : matmul(a_in, g, !trans_a, false);
    return std::vector<Tensor>{da, db};
  });
}

}  // namespace tessel::ops
