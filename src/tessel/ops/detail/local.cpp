#include "tessel/ops/detail/local.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel::ops::detail {

Array compute_shards(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                     const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn) {
  tessel::detail::ArrayBuilder builder(rt, shape, dtype, sharding, {});
  builder.allocate_all();
  std::vector<size_t> local;
  for (size_t s = 0; s < builder.size(); ++s) {
    if (builder.addressable(s)) local.push_back(s);
  }
  // Fewer blocks than cores (one device, say): the blocks run one after another and BLAS gets the
  // cores instead. Otherwise one block per pool task with single-threaded BLAS.
  const int cores = rt.pool().size();
  const int blas = local.size() < static_cast<size_t>(cores) ? std::max(1, cores / std::max<int>(1, static_cast<int>(local.size()))) : 1;
  set_blas_threads(blas);
  if (blas > 1) {
    for (size_t s : local) fn(builder.shard(s).device, builder.shard(s).box, builder.data(s));
  } else {
    rt.pool().parallel_for(static_cast<int64_t>(local.size()), [&](int64_t i) {
      const size_t s = local[static_cast<size_t>(i)];
      fn(builder.shard(s).device, builder.shard(s).box, builder.data(s));
    });
  }
  return std::move(builder).finish();
}

namespace {
// Changed only by the thread that launches ops, between parallel regions; read by workers.
std::atomic<int> g_blas_threads{0};
}  // namespace

void set_blas_threads(int threads) {
  if (threads == g_blas_threads.load()) return;
  openblas_set_num_threads(threads);
  g_blas_threads.store(threads);
}

int blas_threads() { return g_blas_threads.load(); }

void split_range(const Runtime& rt, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  const int cores = rt.pool().size();
  if (blas_threads() <= 1 || n < 2 * grain) {
    body(0, n);
    return;
  }
  // A few-blocks op: this thread launched it and the workers are idle.
  const int64_t pieces = std::min<int64_t>(cores, n / grain);
  rt.pool().parallel_for(pieces, [&](int64_t p) { body(n * p / pieces, n * (p + 1) / pieces); });
}

void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
          const std::byte* b, std::byte* c, bool accumulate) {
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
