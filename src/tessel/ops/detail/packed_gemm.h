// Internal: one matrix B times the rows of many devices' A blocks, with B packed once.
//
// A library GEMM (oneDNN, OpenBLAS) packs B again on every call. With a replicated weight and
// few rows per device (data parallelism on one host: 8 devices of 64 rows against a 16 MiB
// weight) that packing costs about as much as the products, and each device's product runs at
// the efficiency of 64 rows.
// Here the devices that share one B block are multiplied together: B packed once, each packed
// panel used by all their rows. Every row's result depends on its own values only (each k block
// is one fused multiply-add chain from zero, the blocks summed in order), never on which rows
// share a call or how the work is split over the cores: the same bits whether a process holds 8
// devices or 4 or 1.
#pragma once

#include <cstdint>
#include <vector>

namespace tessel::ops::detail {

// One device's rows: A [m, k] (or A^T [k, m] stored, when trans_a) and C [m, n], row-major and
// dense.
struct RowBlock {
  int64_t m;
  const float* a;
  float* c;
};

// Whether this machine runs packed_gemm (it needs AVX-512F).
bool packed_gemm_supported();

// C = A B for every block (C is overwritten), B [k, n] row-major, or [n, k] when trans_b.
// Spread over the cores when called inside a spread region (see spread()). Scratch: one k block
// of B packed at a time (1 MiB per 1024 columns of B), kept by the calling thread. It also serves lone
// products of a short contraction into a large C (weight gradients of few rows per device):
// C is written once (OpenBLAS, which ran them before, first cleared it for beta = 0).
void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const float* b, const std::vector<RowBlock>& blocks);

// One term of a sum of products: A^T stored as [k, m] and B [k, n], row-major and dense (one
// device's rows of a weight gradient).
struct SumTerm {
  int64_t k;
  const float* a;
  const float* b;
};

// The largest k of a SumTerm: one k block, whose product packed_gemm computes as one chain.
int64_t packed_gemm_sum_max_k();

// C [m, n] = the sum over `terms`, in order, of A^T B: the first term's product stored, each next
// one added to C (C + product). Each product is one fused multiply-add chain from zero, as
// packed_gemm(true, false, ...) computes it for k <= packed_gemm_sum_max_k(): the same bits as
// every term's own packed_gemm product reduced in order by the runtime's f32 sum, without writing
// the products. Spread over the cores like packed_gemm. Throws ValueError for a longer k.
void packed_gemm_sum(int64_t m, int64_t n, const std::vector<SumTerm>& terms, float* c);

}  // namespace tessel::ops::detail
