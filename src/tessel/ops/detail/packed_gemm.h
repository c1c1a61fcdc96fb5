// Internal: one matrix B times the rows of many devices' A blocks, with B packed once.
//
// OpenBLAS packs B again on every call. With a replicated weight and few rows per device (data
// parallelism on one host: 8 devices of 64 rows against a 16 MiB weight) that packing costs
// about as much as the products, and each device's product runs at the efficiency of 64 rows.
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
// C is written once, where OpenBLAS first clears it for beta = 0.
void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const float* b, const std::vector<RowBlock>& blocks);

}  // namespace tessel::ops::detail
