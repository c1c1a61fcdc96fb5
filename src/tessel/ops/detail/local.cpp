#include "tessel/ops/detail/local.h"

#include <cblas.h>

#include "tessel/core/error.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel::ops::detail {

Array compute_shards(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                     const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn) {
  tessel::detail::ArrayBuilder builder(rt, shape, dtype, sharding, {});
  builder.allocate_all();
  rt.pool().parallel_for(static_cast<int64_t>(builder.size()), [&](int64_t i) {
    const size_t s = static_cast<size_t>(i);
    if (!builder.addressable(s)) return;
    fn(builder.shard(s).device, builder.shard(s).box, builder.data(s));
  });
  return std::move(builder).finish();
}

void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
          const std::byte* b, std::byte* c, bool accumulate) {
  // The pool runs one task per device; OpenBLAS threads on top would oversubscribe the cores.
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  if (m == 0 || n == 0) return;
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n * static_cast<int64_t>(item_size(dtype)), std::byte{0});
    return;
  }
  switch (dtype) {
    case DType::kF32:
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, reinterpret_cast<const float*>(a), lda,
                  reinterpret_cast<const float*>(b), ldb, accumulate ? 1.0f : 0.0f, reinterpret_cast<float*>(c), N);
      return;
    case DType::kF64:
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, reinterpret_cast<const double*>(a), lda,
                  reinterpret_cast<const double*>(b), ldb, accumulate ? 1.0 : 0.0, reinterpret_cast<double*>(c), N);
      return;
    default:
      throw ValueError("matrix products take f32 or f64, not " + std::string(name(dtype)) + " (cast first)");
  }
}

}  // namespace tessel::ops::detail
