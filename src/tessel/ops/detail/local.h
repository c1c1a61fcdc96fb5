// Internal: the per-device side of the ops. Each device computes its own output block from its
// own input blocks, on the runtime's worker pool; BLAS runs single-threaded inside each task so
// pool threads x BLAS threads stays within the cores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/runtime/array.h"

namespace tessel::ops::detail {

// A concrete array on `sharding` whose every addressable block is written by fn(device, box, out).
Array compute_shards(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                     const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn);
// The same for values whose replicas are equal by construction (an optimizer's update of reduced
// gradients): fn writes one block per distinct box in this process, which the other local
// replicas of that block share. Never for partial sums, whose replicas differ until reduced.
Array compute_blocks_once(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                          const std::function<void(int64_t device, const Box& box, std::byte* out)>& fn);
// `count` arrays of one layout written together: fn(device, box, outs) writes each distinct block
// of all of them in one pass (outs[i] the block of array i), as compute_blocks_once does for one.
std::vector<Array> compute_blocks_once(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                                       size_t count,
                                       const std::function<void(int64_t device, const Box& box,
                                                                const std::vector<std::byte*>& outs)>& fn);

// Arrays of different shapes and shardings whose blocks go together device by device (their
// shardings split the same mesh axes into the same groups of devices, as an op's outputs sharded by
// batch and heads do): fn(device, boxes, outs) writes one device's block of every array in one
// pass (boxes[i] and outs[i] that of array i), once per distinct block as compute_blocks_once
// does; an array whose box is empty there (a dimension of size 0) is not to be written. Throws
// Error if the arrays' blocks do not go together.
struct OutputLayout {
  Shape shape;
  NamedSharding sharding;
};
std::vector<Array> compute_blocks_once(const Runtime& rt, const std::vector<OutputLayout>& layouts, DType dtype,
                                       const std::function<void(int64_t device, const std::vector<Box>& boxes,
                                                                const std::vector<std::byte*>& outs)>& fn);

// One block an op writes: the device, its box of the output and its bytes.
struct BlockTask {
  int64_t device;
  Box box;
  std::byte* out;
};
// compute_shards (or compute_blocks_once when `replicas_equal`) where a single fn call writes all
// the blocks (products that share an operand across devices), on the launching thread with the
// cores available to split_range.
Array compute_blocks_together(const Runtime& rt, const Shape& shape, DType dtype, const NamedSharding& sharding,
                              bool replicas_equal, const std::function<void(const std::vector<BlockTask>&)>& fn);
// fn() on this thread with the cores lent to split_range, as a 1-device op runs its block (what
// compute_blocks_together does around its fn): how benchmarks and tests run one product the way
// the ops would.
void run_spread(const Runtime& rt, const std::function<void()>& fn);

// OpenBLAS's thread count (process-wide). Ops keep it at 1 and split work over the pool.
void set_blas_threads(int threads);
// The kernel family OpenBLAS runs ("Cooperlake", "Haswell": see OPENBLAS_CORETYPE and
// blas_setup.h).
const char* blas_core();

// Inside a compute_shards fn: the cores the fn may spread over (> 1 only when the op has fewer
// blocks than cores and runs them on the launching thread), and body(lo, hi) over pieces of
// [0, n) on those cores, each piece at least `grain` items (else body(0, n) here).
int spread();
void split_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);
// split_range over `rows` rows of `row_items` elements, in pieces of whole rows worth at least
// 16K elements: how a lone block's element loops (elementwise, broadcasting, transposes) share
// the cores.
void split_rows(int64_t rows, int64_t row_items, const std::function<void(int64_t, int64_t)>& body);

// On CPUs with AVX-512, f32 products of at least 2^16 multiply-adds run oneDNN's sgemm,
// single-threaded per call (its JIT AVX-512 kernels: split over both cores of the Intel VM, 1.07
// to 1.29x the rate of OpenBLAS on its own two threads on the models' shapes); smaller ones
// OpenBLAS's, whose call costs less (0.1 to 0.2 us against oneDNN's 0.3 to 0.4), as do f64
// products. Without AVX-512 every product runs OpenBLAS: on the AMD EPYC (Zen 3) VM its Zen
// kernels, single-threaded on halves of C, ran the models' shapes 0.87 to 1.58x oneDNN's AVX2
// rate (faster on 5 of 9, within 1% on 3). The choice depends on the shape and the CPU only, so
// a product's bits do too.
constexpr int64_t kSgemmDnnlMinWork = int64_t{1} << 16;
bool sgemm_runs_dnnl(int64_t m, int64_t n, int64_t k);

// Row-major C[m,n] = op(A) op(B) (+ C when accumulate), f32 or f64, with the leading dimensions
// given (rows of A, B and C lda, ldb, ldc elements apart): one call on this thread.
void gemm_strided(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
                  int64_t lda, const std::byte* b, int64_t ldb, std::byte* c, int64_t ldc, bool accumulate);

// How many pieces gemm cuts a product's C into along its longer side (rows when m >= n, else
// columns): kProductPieces halves when that side has at least 2 x kProductPieceMin, else one.
// Decided by the shape alone, never by the cores: oneDNN picks its kernel (copy-based or not) by
// each call's shape, and with it the bits (a [1200, 1000] x [1000, 1000] product in one call and
// in two halves of its rows differ), so a block's product is cut alike whether the pool spreads it
// over the cores, one core runs it, or another process does. Two pieces: this project's machines
// have two cores, and each piece packs the shared operand again.
constexpr int64_t kProductPieces = 2;
constexpr int64_t kProductPieceMin = 64;
int64_t product_pieces(int64_t m, int64_t n);

// Row-major C[m,n] = op(A) op(B) (+ C when accumulate), f32 or f64; op transposes when asked.
// Cut into product_pieces(m, n) calls, spread over the cores when spread() > 1.
void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const std::byte* a,
          const std::byte* b, std::byte* c, bool accumulate);

}  // namespace tessel::ops::detail
