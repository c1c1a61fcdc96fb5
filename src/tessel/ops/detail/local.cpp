#include "tessel/ops/detail/local.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/detail/blas_setup.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/runtime.h"
#include "tessel/runtime/worker_pool.h"

// The OpenMP runtime's per-thread setting (libgomp, which oneDNN runs on), declared here rather
// than through <omp.h>: that header lives in g++'s own include directory, which clang (the
// fuzzers' compiler) does not search.
extern "C" {
void omp_set_num_threads(int threads);
int omp_get_max_threads(void);
}

namespace tessel::ops::detail {

namespace {
// Set only by the thread that launches ops, between parallel regions; read by workers.
std::atomic<int> g_blas_threads{0};
// While an op with fewer blocks than cores runs its blocks on the launching thread: the pool
// whose idle workers split the work inside each block (split_range, gemm).
std::atomic<WorkerPool*> g_spread_pool{nullptr};
}  // namespace

namespace {

// Lends the pool to split_range inside its scope, unless an outer scope already did.
class SpreadScope {
 public:
  explicit SpreadScope(WorkerPool& pool) : owner_(g_spread_pool.load() == nullptr) {
    if (owner_) g_spread_pool.store(&pool);
  }
  ~SpreadScope() {
    if (owner_) g_spread_pool.store(nullptr);
  }
  SpreadScope(const SpreadScope&) = delete;
  SpreadScope& operator=(const SpreadScope&) = delete;

 private:
  bool owner_;
};

// Runs fn(i) for i in [0, count), one per block: one block per pool task when there are at least
// as many blocks as cores; with fewer (one device), the blocks one after another, the work inside
// each split over the pool. BLAS stays single-threaded: its own spinning threads would fight the
// pool for the cores.
void run_blocks(const Runtime& rt, size_t count, const std::function<void(size_t i)>& fn) {
  set_blas_threads(1);
  if (count < static_cast<size_t>(rt.pool().size()) && g_spread_pool.load() == nullptr) {
    SpreadScope spread(rt.pool());
    for (size_t i = 0; i < count; ++i) fn(i);
  } else {
    rt.pool().parallel_for(static_cast<int64_t>(count), [&](int64_t i) { fn(static_cast<size_t>(i)); });
  }
}

// run_blocks over the builder's blocks `which`.
void run_blocks(const Runtime& rt, const tessel::detail::ArrayBuilder& builder, const std::vector<size_t>& which,
                const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn) {
  run_blocks(rt, which.size(), [&](size_t i) {
    const size_t s = which[i];
    fn(builder.shard(s).device, builder.shard(s).box, builder.data(s));
  });
}

// The blocks this process writes, never an empty one (uneven splits leave some empty): one per
// distinct box when local replicas share their bytes, else every addressable block.
std::vector<size_t> blocks_to_write(const tessel::detail::ArrayBuilder& builder, bool replicas_shared) {
  std::vector<size_t> which;
  if (replicas_shared) {
    for (const auto& block : builder.local_blocks()) which.push_back(block.first);
  } else {
    for (size_t s = 0; s < builder.size(); ++s)
      if (builder.addressable(s)) which.push_back(s);
  }
  std::erase_if(which, [&](size_t s) { return builder.shard(s).box.volume() == 0; });
  return which;
}

}  // namespace

Array compute_shards(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                     const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn) {
  tessel::detail::ArrayBuilder builder(rt, shape, dtype, sharding, {});
  builder.allocate_all();
  run_blocks(rt, builder, blocks_to_write(builder, false), fn);
  return std::move(builder).finish();
}

Array compute_blocks_once(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                          const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn) {
  tessel::detail::ArrayBuilder builder(rt, shape, dtype, sharding, {});
  builder.share_local_replicas();
  builder.allocate_all();
  run_blocks(rt, builder, blocks_to_write(builder, true), fn);
  return std::move(builder).finish();
}

std::vector<Array> compute_blocks_once(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                                       size_t count,
                                       const std::function<void(int64_t device, const Box& box,
                                                                const std::vector<std::byte*>& outs)>& fn) {
  return compute_blocks_once(rt, std::vector<OutputLayout>(count, OutputLayout{shape, sharding}), dtype,
                             [&](int64_t device, const std::vector<Box>& boxes, const std::vector<std::byte*>& outs) {
                               fn(device, boxes.front(), outs);
                             });
}

std::vector<Array> compute_blocks_once(const Runtime& rt, const std::vector<OutputLayout>& layouts, DType dtype,
                                       const std::function<void(int64_t device, const std::vector<Box>& boxes,
                                                                const std::vector<std::byte*>& outs)>& fn) {
  std::vector<tessel::detail::ArrayBuilder> builders;
  builders.reserve(layouts.size());
  for (const OutputLayout& l : layouts) {
    builders.emplace_back(rt, l.shape, dtype, l.sharding, std::string{});
    builders.back().share_local_replicas();
    builders.back().allocate_all();
  }
  if (builders.empty()) return {};
  // The blocks any output writes; each output writes exactly those of them its box is not empty
  // in (an output with a dimension of size 0 writes none, the others go on).
  std::vector<std::vector<size_t>> each;
  std::vector<size_t> which;
  for (const auto& b : builders) {
    each.push_back(blocks_to_write(b, true));
    std::sort(each.back().begin(), each.back().end());
    which.insert(which.end(), each.back().begin(), each.back().end());
  }
  std::sort(which.begin(), which.end());
  which.erase(std::unique(which.begin(), which.end()), which.end());
  for (size_t i = 0; i < builders.size(); ++i) {
    for (size_t s : which) {
      if (builders[i].shard(s).box.volume() != 0 && !std::binary_search(each[i].begin(), each[i].end(), s))
        throw Error("compute_blocks_once: the blocks of " + layouts[i].sharding.to_string() + " and " +
                    layouts.front().sharding.to_string() + " do not go together device by device");
    }
  }
  run_blocks(rt, which.size(), [&](size_t i) {
    const size_t s = which[i];
    std::vector<Box> boxes;
    std::vector<std::byte*> outs;
    for (const auto& b : builders) {
      boxes.push_back(b.shard(s).box);
      outs.push_back(b.data(s));
    }
    fn(builders.front().shard(s).device, boxes, outs);
  });
  std::vector<Array> out;
  for (auto& b : builders) out.push_back(std::move(b).finish());
  return out;
}

Array compute_blocks_together(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                              bool replicas_equal, const std::function<void(const std::vector<BlockTask>&)>& fn) {
  tessel::detail::ArrayBuilder builder(rt, shape, dtype, sharding, {});
  if (replicas_equal) builder.share_local_replicas();
  builder.allocate_all();
  std::vector<BlockTask> tasks;
  for (size_t s : blocks_to_write(builder, replicas_equal))
    tasks.push_back({builder.shard(s).device, builder.shard(s).box, builder.data(s)});
  run_spread(rt, [&] { fn(tasks); });
  return std::move(builder).finish();
}

void run_spread(const Runtime& rt, const std::function<void()>& fn) {
  set_blas_threads(1);
  SpreadScope spread(rt.pool());
  fn();
}

void set_blas_threads(int threads) {
  ensure_blas_setup();
  if (threads == g_blas_threads.load()) return;
  openblas_set_num_threads(threads);
  g_blas_threads.store(threads);
}

const char* blas_core() {
  ensure_blas_setup();
  return openblas_get_corename();
}

int spread() {
  WorkerPool* pool = g_spread_pool.load();
  return pool ? pool->size() : 1;
}

void split_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  WorkerPool* pool = g_spread_pool.load();
  if (!pool || n < 2 * grain) {
    body(0, n);
    return;
  }
  const int64_t pieces = std::min<int64_t>(pool->size(), n / grain);
  pool->parallel_for(pieces, [&](int64_t p) { body(n * p / pieces, n * (p + 1) / pieces); });
}

void split_rows(int64_t rows, int64_t row_items, const std::function<void(int64_t, int64_t)>& body) {
  constexpr int64_t kGrainItems = int64_t{1} << 14;
  split_range(rows, std::max<int64_t>(1, kGrainItems / std::max<int64_t>(row_items, 1)), body);
}

bool sgemm_runs_dnnl(int64_t m, int64_t n, int64_t k) {
  static const bool faster_here = CpuFeatures::of_this_cpu().avx512;
  return faster_here && m * n * k >= kSgemmDnnlMinWork;
}

int64_t product_pieces(int64_t m, int64_t n) { return std::max(m, n) >= 2 * kProductPieceMin ? kProductPieces : 1; }

namespace {

// oneDNN's sgemm on this thread alone: tessel's pool splits products itself, and oneDNN would
// otherwise start as many OpenMP threads as the calling thread may (the cores), beside the pool's.
// Its bits then depend on the product's own shape and values only: not on how the rows or columns
// of C are split over the cores, nor on the operands' alignment.
void sgemm_dnnl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);  // this thread's setting only
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                                          accumulate ? 1.0f : 0.0f, c, ldc);
  if (status != dnnl_success)
    throw Error("oneDNN's sgemm failed with status " + std::to_string(static_cast<int>(status)) + " on [" +
                std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(k) + ", " + std::to_string(n) +
                "] (lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) + ")");
}

// Whether an f32 or f64 product runs oneDNN (f32 only, by shape).
bool runs_dnnl(DType dtype, int64_t m, int64_t n, int64_t k) { return dtype == DType::kF32 && sgemm_runs_dnnl(m, n, k); }

// One call on this thread; through oneDNN when `dnnl` (runs_dnnl of the whole product, so that
// the pieces of a split product run as the whole would).
void gemm_ld(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
             int64_t lda, const std::byte* b, int64_t ldb, std::byte* c, int64_t ldc, bool accumulate, bool dnnl) {
  if (dnnl) {
    return sgemm_dnnl(trans_a, trans_b, m, n, k, reinterpret_cast<const float*>(a), lda, reinterpret_cast<const float*>(b),
                      ldb, reinterpret_cast<float*>(c), ldc, accumulate);
  }
  ensure_blas_setup();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  switch (dtype) {
    case DType::kF32:
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, reinterpret_cast<const float*>(a), static_cast<int>(lda),
                  reinterpret_cast<const float*>(b), static_cast<int>(ldb), accumulate ? 1.0f : 0.0f,
                  reinterpret_cast<float*>(c), static_cast<int>(ldc));
      return;
    case DType::kF64:
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, reinterpret_cast<const double*>(a), static_cast<int>(lda),
                  reinterpret_cast<const double*>(b), static_cast<int>(ldb), accumulate ? 1.0 : 0.0,
                  reinterpret_cast<double*>(c), static_cast<int>(ldc));
      return;
    default:
      throw ValueError("matrix products take f32 or f64, not " + std::string(name(dtype)) + " (cast first)");
  }
}

}  // namespace

void gemm_strided(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
                  int64_t lda, const std::byte* b, int64_t ldb, std::byte* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (accumulate) return;
    const size_t item = item_size(dtype);
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc * static_cast<int64_t>(item), 0, static_cast<size_t>(n) * item);
    return;
  }
  gemm_ld(dtype, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate, runs_dnnl(dtype, m, n, k));
}

void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
          const std::byte* b, std::byte* c, bool accumulate) {
  if (m == 0 || n == 0) return;
  const int64_t item = static_cast<int64_t>(item_size(dtype));
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  if (k == 0) return gemm_strided(dtype, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, n, accumulate);
  const bool dnnl = runs_dnnl(dtype, m, n, k);
  // Never on OpenBLAS's own threads: its threaded driver cuts k into other blocks than its
  // single-threaded one, so a product spread that way (a process holding one device) had other
  // bits than the same product run by one core (a process holding several).
  // Cut into pieces by the shape alone (product_pieces), run over the pool when spread, one after
  // the other otherwise: the same calls, so the same bits, wherever the product runs.
  const int64_t pieces = product_pieces(m, n);
  const bool by_rows = m >= n;
  const int64_t side = by_rows ? m : n;
  split_range(pieces, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = side * p / pieces, hi = side * (p + 1) / pieces;
      if (by_rows) {
        const std::byte* pa = a + (trans_a ? lo : lo * lda) * item;
        gemm_ld(dtype, trans_a, trans_b, hi - lo, n, k, pa, lda, b, ldb, c + lo * n * item, n, accumulate, dnnl);
      } else {
        const std::byte* pb = b + (trans_b ? lo * ldb : lo) * item;
        gemm_ld(dtype, trans_a, trans_b, m, hi - lo, k, a, lda, pb, ldb, c + lo * item, n, accumulate, dnnl);
      }
    }
  });
}

}  // namespace tessel::ops::detail
