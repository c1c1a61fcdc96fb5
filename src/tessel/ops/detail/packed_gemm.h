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

#include <cstddef>
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

// A row-major matrix stored as a grid of dense pieces: the shards of a weight split along either
// dimension, read in place by packed_gemm where a gathered copy would cost a pass over the weight
// (a weight sharded for FSDP on one host). Piece (i, j) holds rows [row_at[i], row_at[i + 1]) and
// columns [col_at[j], col_at[j + 1]), row-major with its own width, at data[i * pieces across + j].
struct Pieces {
  std::vector<int64_t> row_at{0}, col_at{0};  // each ends with the matrix's extent
  std::vector<const float*> data;

  // The whole matrix in one piece.
  static Pieces dense(int64_t rows, int64_t cols, const float* data);
  int64_t rows() const { return row_at.back(); }
  int64_t cols() const { return col_at.back(); }
  // The piece holding row r (column c): the last i with row_at[i] <= r.
  size_t row_piece(int64_t r) const;
  size_t col_piece(int64_t c) const;
  // Element (r, c), with the rest of its row within the piece at the pointer.
  const float* at(size_t i, size_t j, int64_t r, int64_t c) const {
    return data[i * (col_at.size() - 1) + j] + (r - row_at[i]) * (col_at[j + 1] - col_at[j]) + (c - col_at[j]);
  }
};

// Whether this machine runs packed_gemm (it needs AVX-512F, or AVX2 with FMA). Both give the same
// bits: each k block's chain is the same whatever the vector width.
bool packed_gemm_supported();
// For tests: run the AVX2 kernels even where AVX-512F is there (they must give its bits).
void packed_gemm_prefer_avx2(bool yes);

// C = A B for every block (C is overwritten), B [k, n] row-major, or [n, k] when trans_b.
// Spread over the cores when called inside a spread region (see spread()). Scratch: one k block
// of B packed at a time (1 MiB per 1024 columns of B), kept by the calling thread. It also serves lone
// products of a short contraction into a large C (weight gradients of few rows per device):
// C is written once (OpenBLAS, which ran them before, first cleared it for beta = 0).
void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const float* b, const std::vector<RowBlock>& blocks);
// The same with B in pieces (stored [k, n], or [n, k] when trans_b): the same bits as B dense.
void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const Pieces& b, const std::vector<RowBlock>& blocks);

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
