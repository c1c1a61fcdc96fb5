#include "tessel/ops/detail/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"

namespace tessel::ops::detail {

namespace {

// The k block: each C element of a block is one fused multiply-add chain from zero, the blocks
// added in order. The same on every instruction set below, so their results have the same bits.
// A packed A tile (14 KiB at 14 rows) stays in L1 while a group of B panels passes it.
constexpr int64_t kKc = 256;
// How far ahead (in k) the kernels fetch B: its panels come from L2.
constexpr int64_t kPrefetch = 16;

// Floats per cache line: packed panels start on a line, so no 64-byte load straddles two.
constexpr size_t kLine = 16;
float* aligned(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

int64_t k_blocks_of(int64_t k) { return (k + kKc - 1) / kKc; }

// C tile (R rows, `cols` <= kNr columns) = or += the sum of `terms` products in order, term t
// being as[t] [ks[t]][kMr] times bs[t] [ks[t]][kNr]: each a fused multiply-add chain over p from
// zero, then stored (the first, unless `add`) or added to C. Independent of R. One call for all
// the terms of a sum (packed_gemm_sum's devices): a call per term cost 10% of those products.
using Kernel = void (*)(int terms, const int64_t* ks, const float* const* as, const float* const* bs, float* c,
                        int64_t ldc, int cols, bool add);

// ---- AVX-512F: tiles of 14 rows by 32 columns (two 16-lane registers), 28 accumulators. Sizes
// measured on the project's Zen 4 VM (see multiply_panels).

// transpose16 in 4 steps of b = 8, 4, 2, 1: rows i and i + b (i without bit b) swap their lanes
// with bit b set in row i for those with it clear in row i + b. The lanes one two-register
// permute picks for the new row i (keep) and row i + b (swap).
struct TransposeStep {
  alignas(64) int keep[16];
  alignas(64) int swap[16];
};
constexpr TransposeStep transpose_step(int b) {
  TransposeStep s{};
  for (int j = 0; j < 16; ++j) {
    s.keep[j] = (j & b) ? 16 + j - b : j;
    s.swap[j] = (j & b) ? 16 + j : j + b;
  }
  return s;
}
constexpr TransposeStep kTransposeSteps[4] = {transpose_step(8), transpose_step(4), transpose_step(2), transpose_step(1)};

// r[i] (16 floats each) becomes column i of the 16 x 16 block they held.
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  for (int step = 0; step < 4; ++step) {
    const int b = 8 >> step;
    const __m512i keep = _mm512_load_si512(kTransposeSteps[step].keep);
    const __m512i swap = _mm512_load_si512(kTransposeSteps[step].swap);
    for (int i = 0; i < 16; ++i) {
      if (i & b) continue;
      const __m512 lo = r[i], hi = r[i + b];
      r[i] = _mm512_permutex2var_ps(lo, keep, hi);
      r[i + b] = _mm512_permutex2var_ps(lo, swap, hi);
    }
  }
}

template <int R>
__attribute__((target("avx512f"))) void kernel16(int terms, const int64_t* ks, const float* const* as,
                                                 const float* const* bs, float* c, int64_t ldc, int cols, bool add) {
  constexpr int kMr = 14, kNr = 32;
  const auto m0 = static_cast<__mmask16>(cols >= 16 ? 0xffffu : (1u << cols) - 1);
  const auto m1 = static_cast<__mmask16>(cols >= 32 ? 0xffffu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1);
  // The tile's rows of C are far apart: start fetching them while the products run.
  for (int i = 0; i < R; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16), _MM_HINT_T0);
  }
  for (int t = 0; t < terms; ++t) {
    __m512 lo[R], hi[R];
    for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
    const float* a = as[t];
    const float* b = bs[t];
    for (int64_t p = 0; p < ks[t]; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(b + (p + kPrefetch) * kNr), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + (p + kPrefetch) * kNr + 16), _MM_HINT_T0);
      const __m512 b0 = _mm512_loadu_ps(b + p * kNr), b1 = _mm512_loadu_ps(b + p * kNr + 16);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const __m512 ai = _mm512_set1_ps(a[p * kMr + i]);
        lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
        hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      float* row = c + i * ldc;
      __m512 v0 = lo[i], v1 = hi[i];
      if (add || t > 0) {
        v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), v0);
        v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), v1);
      }
      _mm512_mask_storeu_ps(row, m0, v0);
      _mm512_mask_storeu_ps(row + 16, m1, v1);
    }
  }
}

struct Avx512 {
  static constexpr int kMr = 14, kNr = 32;
  // Rows and columns of the blocks a transposed operand is packed in, in registers.
  static constexpr int kW = 16;
  // Panels of B a core keeps in L2 while tiles of A pass them (256 KiB of a full k block).
  static constexpr int64_t kPanelsPerGroup = 8;
  static constexpr Kernel kKernels[kMr + 1] = {
      nullptr,      kernel16<1>,  kernel16<2>,  kernel16<3>,  kernel16<4>,  kernel16<5>,  kernel16<6>, kernel16<7>,
      kernel16<8>,  kernel16<9>,  kernel16<10>, kernel16<11>, kernel16<12>, kernel16<13>, kernel16<14>};

  // rows[i] (kW floats each, i < kW) transposed: lanes [0, lanes) of column j stored at out + j * ld.
  __attribute__((target("avx512f"))) static void transpose(const float* const* rows, float* out, int64_t ld,
                                                           int lanes) {
    const auto mask = static_cast<__mmask16>((1u << lanes) - 1);
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = rows[i] ? _mm512_loadu_ps(rows[i]) : _mm512_setzero_ps();
    transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(out + j * ld, mask, r[j]);
  }

  // The stored A^T's columns [p0, p0 + kc) of the tile's `rows` rows (lda = m) as [p][kMr].
  __attribute__((target("avx512f"))) static void pack_columns(const float* a, int64_t lda, int rows, int64_t p0,
                                                              int64_t kc, float* out) {
    const auto valid = static_cast<__mmask16>((1u << rows) - 1), tile = static_cast<__mmask16>((1u << kMr) - 1);
    for (int64_t p = 0; p < kc; ++p)
      _mm512_mask_storeu_ps(out + p * kMr, tile, _mm512_maskz_loadu_ps(valid, a + (p0 + p) * lda));
  }
};

// ---- AVX2 and FMA: tiles of 6 rows by 16 columns (two 8-lane registers), 12 accumulators of the
// 16 registers.

// r[i] (8 floats each) becomes column i of the 8 x 8 block they held.
__attribute__((target("avx2,fma"))) inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Lanes [0, n) of an 8-lane mask (n clamped to [0, 8]).
__attribute__((target("avx2,fma"))) inline __m256i first_lanes(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}

template <int R>
__attribute__((target("avx2,fma"))) void kernel8(int terms, const int64_t* ks, const float* const* as,
                                                 const float* const* bs, float* c, int64_t ldc, int cols, bool add) {
  constexpr int kMr = 6, kNr = 16;
  const bool whole = cols == kNr;
  const __m256i m0 = first_lanes(cols), m1 = first_lanes(cols - 8);
  for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  for (int t = 0; t < terms; ++t) {
    __m256 lo[R], hi[R];
    for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
    const float* a = as[t];
    const float* b = bs[t];
    // The depth in a register and the loop unrolled: 1.0 to 1.15x the rate of the plain loop (one
    // core, DotReluDot's shapes), about OpenBLAS's Zen kernels'.
    const int64_t depth = ks[t];
#pragma GCC unroll 4
    for (int64_t p = 0; p < depth; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(b + (p + kPrefetch) * kNr), _MM_HINT_T0);
      const __m256 b0 = _mm256_loadu_ps(b + p * kNr), b1 = _mm256_loadu_ps(b + p * kNr + 8);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a + p * kMr + i);
        lo[i] = _mm256_fmadd_ps(ai, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(ai, b1, hi[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      float* row = c + i * ldc;
      __m256 v0 = lo[i], v1 = hi[i];
      if (whole) {
        if (add || t > 0) {
          v0 = _mm256_add_ps(_mm256_loadu_ps(row), v0);
          v1 = _mm256_add_ps(_mm256_loadu_ps(row + 8), v1);
        }
        _mm256_storeu_ps(row, v0);
        _mm256_storeu_ps(row + 8, v1);
        continue;
      }
      if (add || t > 0) {
        v0 = _mm256_add_ps(_mm256_maskload_ps(row, m0), v0);
        v1 = _mm256_add_ps(_mm256_maskload_ps(row + 8, m1), v1);
      }
      _mm256_maskstore_ps(row, m0, v0);
      _mm256_maskstore_ps(row + 8, m1, v1);
    }
  }
}

struct Avx2 {
  static constexpr int kMr = 6, kNr = 16;
  static constexpr int kW = 8;
  // 256 KiB of B in L2, as on AVX-512 (Zen 3's L2 is 512 KiB).
  static constexpr int64_t kPanelsPerGroup = 16;
  static constexpr Kernel kKernels[kMr + 1] = {nullptr,    kernel8<1>, kernel8<2>, kernel8<3>,
                                               kernel8<4>, kernel8<5>, kernel8<6>};

  __attribute__((target("avx2,fma"))) static void transpose(const float* const* rows, float* out, int64_t ld,
                                                            int lanes) {
    const __m256i mask = first_lanes(lanes);
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = rows[i] ? _mm256_loadu_ps(rows[i]) : _mm256_setzero_ps();
    transpose8(r);
    for (int j = 0; j < 8; ++j) _mm256_maskstore_ps(out + j * ld, mask, r[j]);
  }

  __attribute__((target("avx2,fma"))) static void pack_columns(const float* a, int64_t lda, int rows, int64_t p0,
                                                               int64_t kc, float* out) {
    const __m256i valid = first_lanes(rows), tile = first_lanes(kMr);
    for (int64_t p = 0; p < kc; ++p)
      _mm256_maskstore_ps(out + p * kMr, tile, _mm256_maskload_ps(a + (p0 + p) * lda, valid));
  }
};

// ---- The drivers, the same for every instruction set.

template <class Isa>
int64_t panels_of(int64_t n) {
  return (n + Isa::kNr - 1) / Isa::kNr;
}

// B's k block kb, panels [j0, j1), packed as [panel][p][kNr] with panel j - j0 at out + (j - j0)
// * stride, the columns past n zero. A stored B^T is packed in kW x kW blocks transposed in
// registers (and pack_a's rows of A likewise): packed element by element at the baseline's SSE
// width, the two packings had 9.5% of the samples of DotReluDot's fsdp=8 step, now 7%. B is read
// in place from its pieces: a block or a panel's row that crosses pieces is copied in stretches
// (element by element for the transposed blocks; shards of kW and more rows never do).
template <class Isa>
void pack_b(bool trans_b, int64_t k, int64_t n, const Pieces& b, int64_t kb, float* out, int64_t stride, int64_t j0,
            int64_t j1) {
  constexpr int kNr = Isa::kNr, kW = Isa::kW;
  const int64_t p0 = kb * kKc, kc = std::min(kKc, k - p0);
  // Element (r, c) of the stored matrix, found from scratch: for the stretches blocks leave.
  auto element = [&](int64_t r, int64_t c) { return *b.at(b.row_piece(r), b.col_piece(c), r, c); };
  for (int64_t j = j0; j < j1; ++j) {
    float* dst = out + (j - j0) * stride;
    const int64_t c0 = j * kNr, cols = std::min<int64_t>(kNr, n - c0);
    if (cols < kNr) std::memset(dst, 0, sizeof(float) * kc * kNr);
    if (!trans_b) {
      // The panel's columns as stretches of pieces (one, unless a piece ends inside the panel).
      struct Stretch {
        size_t piece;
        int64_t c, count;
      };
      Stretch stretches[kNr];
      int count = 0;
      for (int64_t c = 0; c < cols;) {
        const size_t jp = b.col_piece(c0 + c);
        const int64_t run = std::min(cols - c, b.col_at[jp + 1] - (c0 + c));
        stretches[count++] = {jp, c, run};
        c += run;
      }
      size_t i = b.row_piece(p0);
      for (int64_t p = 0; p < kc; ++p) {
        const int64_t r = p0 + p;
        while (r >= b.row_at[i + 1]) ++i;
        float* d = dst + p * kNr;
        if (count == 1 && cols == kNr) {
          std::memcpy(d, b.at(i, stretches[0].piece, r, c0), sizeof(float) * kNr);
          continue;
        }
        for (int s = 0; s < count; ++s) {
          const Stretch& st = stretches[s];
          std::memcpy(d + st.c, b.at(i, st.piece, r, c0 + st.c), sizeof(float) * st.count);
        }
      }
      continue;
    }
    // Stored rows c0 + c (columns of B), their pieces looked up once per panel.
    size_t row_piece[kNr];
    for (int64_t c = 0; c < cols; ++c) row_piece[c] = b.row_piece(c0 + c);
    // Whole kW x kW blocks in registers where their kW k lie in one piece, then what they leave
    // (past n's last kW, past k's, across pieces) one by one.
    const int64_t block_cols = cols / kW * kW;
    for (int64_t p = 0; p < kc; p += kW) {
      const size_t jp = b.col_piece(p0 + p);
      const int64_t depth = std::min<int64_t>(kW, kc - p);
      const bool whole = depth == kW && p0 + p + kW <= b.col_at[jp + 1];
      for (int64_t c = 0; c < cols; c += kW) {
        if (whole && c < block_cols) {
          const float* rows[kW];
          for (int i = 0; i < kW; ++i) rows[i] = b.at(row_piece[c + i], jp, c0 + c + i, p0 + p);
          Isa::transpose(rows, dst + p * kNr + c, kNr, kW);
          continue;
        }
        for (int64_t cc = c; cc < std::min<int64_t>(cols, c + kW); ++cc)
          for (int64_t q = p; q < p + depth; ++q) dst[q * kNr + cc] = element(c0 + cc, p0 + q);
      }
    }
  }
}

// A tile's rows of A's k block as [p][kMr], the rows past `rows` zero: from the tile's first row
// of A [m, k] (lda = k), or when trans_a from its first column of the stored A^T [k, m] (lda = m).
template <class Isa>
void pack_a(bool trans_a, const float* a, int64_t lda, int rows, int64_t p0, int64_t kc, float* out) {
  constexpr int kMr = Isa::kMr, kW = Isa::kW;
  if (trans_a) return Isa::pack_columns(a, lda, rows, p0, kc, out);
  // Rows of A: kW k at a time, transposed in registers (the rows past `rows` zero).
  int64_t p = 0;
  for (; p + kW <= kc; p += kW) {
    const float* r[kW];
    for (int i = 0; i < kW; ++i) r[i] = i < rows ? a + i * lda + p0 + p : nullptr;
    Isa::transpose(r, out + p * kMr, kMr, kMr);
  }
  for (; p < kc; ++p) {
    for (int64_t r = 0; r < rows; ++r) out[p * kMr + r] = a[r * lda + p0 + p];
    for (int64_t r = rows; r < kMr; ++r) out[p * kMr + r] = 0.0f;
  }
}

// A tile of kMr rows (or fewer) of one block: where its A rows and its C rows start.
struct Tile {
  const float* a;
  int64_t lda;
  float* c;
  int rows;
};

// Panels [j0, j1) of C for every tile, k block kb (B packed). Tiles in groups of kTilesPerGroup
// (packed once per group), panels in groups of kPanelsPerGroup (256 KiB of B, kept in L2 while
// the group's tiles pass); each tile runs over the panel group while its packed A stays in L1.
// Measured against the other orders (panels outer, B in L1): 5 to 15% faster on DotReluDot's
// data=8 shapes.
template <class Isa>
void multiply_panels(bool trans_a, int64_t k, int64_t n, int64_t kb, const float* packed_b,
                     const std::vector<Tile>& tiles, int64_t j0, int64_t j1) {
  constexpr int kMr = Isa::kMr, kNr = Isa::kNr;
  constexpr size_t kTilesPerGroup = 40;
  thread_local std::vector<float> packed_a_buffer;
  packed_a_buffer.resize(kTilesPerGroup * kKc * kMr + kLine);
  float* const packed_a = aligned(packed_a_buffer.data());
  const int64_t p0 = kb * kKc, kc = std::min(kKc, k - p0);
  for (size_t g0 = 0; g0 < tiles.size(); g0 += kTilesPerGroup) {
    const size_t g1 = std::min(tiles.size(), g0 + kTilesPerGroup);
    for (size_t t = g0; t < g1; ++t) {
      pack_a<Isa>(trans_a, tiles[t].a, tiles[t].lda, tiles[t].rows, p0, kc, packed_a + (t - g0) * kKc * kMr);
    }
    for (int64_t jg = j0; jg < j1; jg += Isa::kPanelsPerGroup) {
      for (size_t t = g0; t < g1; ++t) {
        for (int64_t j = jg; j < std::min(j1, jg + Isa::kPanelsPerGroup); ++j) {
          const float* panel = packed_b + j * kKc * kNr;
          const int cols = static_cast<int>(std::min<int64_t>(kNr, n - j * kNr));
          const float* a = packed_a + (t - g0) * kKc * kMr;
          Isa::kKernels[tiles[t].rows](1, &kc, &a, &panel, tiles[t].c + j * kNr, n, cols, kb > 0);
        }
      }
    }
  }
}

template <class Isa>
void run_packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const Pieces& b,
                     const std::vector<RowBlock>& blocks) {
  constexpr int kMr = Isa::kMr, kNr = Isa::kNr;
  const int64_t panels = panels_of<Isa>(n);
  std::vector<Tile> tiles;
  for (const RowBlock& r : blocks) {
    for (int64_t i = 0; i < r.m; i += kMr) {
      const int rows = static_cast<int>(std::min<int64_t>(kMr, r.m - i));
      tiles.push_back(trans_a ? Tile{r.a + i, r.m, r.c + i * n, rows} : Tile{r.a + i * k, k, r.c + i * n, rows});
    }
  }
  // One k block of B packed at a time (1 MiB per 1024 columns, whatever the weight's size), kept
  // by the launching thread between calls: a fresh buffer per product would pay its page faults
  // every time.
  thread_local std::vector<float> packed_b;
  packed_b.resize(static_cast<size_t>(panels * kKc * kNr + kLine));
  float* packed = aligned(packed_b.data());
  // Each core packs the panels it multiplies: no core waits for another's packing.
  split_range(panels, 128 / kNr, [&](int64_t j0, int64_t j1) {
    for (int64_t kb = 0; kb < k_blocks_of(k); ++kb) {
      pack_b<Isa>(trans_b, k, n, b, kb, packed + j0 * kKc * kNr, kKc * kNr, j0, j1);
      multiply_panels<Isa>(trans_a, k, n, kb, packed, tiles, j0, j1);
    }
  });
}

template <class Isa>
void run_packed_gemm_sum(int64_t m, int64_t n, const std::vector<SumTerm>& terms, float* c) {
  constexpr int kMr = Isa::kMr, kNr = Isa::kNr;
  // A tile's rows of every term, packed once for all the panels: [tile][term][p][kMr].
  std::vector<int64_t> a_at;  // each term's offset inside a tile's stretch
  int64_t tile_floats = 0, b_floats = 0;
  for (const SumTerm& t : terms) {
    a_at.push_back(tile_floats);
    tile_floats += t.k * kMr;
    b_floats += t.k * kNr;
  }
  const int64_t tiles = (m + kMr - 1) / kMr, panels = panels_of<Isa>(n);
  thread_local std::vector<float> packed_a_buffer;
  packed_a_buffer.resize(static_cast<size_t>(tiles * tile_floats) + kLine);
  float* const packed_a = aligned(packed_a_buffer.data());
  split_range(tiles, 112 / kMr, [&](int64_t t0, int64_t t1) {
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int rows = static_cast<int>(std::min<int64_t>(kMr, m - tile * kMr));
      for (size_t t = 0; t < terms.size(); ++t) {
        // An empty term (a device without rows) may have no buffer at all: nothing to pack.
        if (terms[t].k > 0)
          pack_a<Isa>(true, terms[t].a + tile * kMr, m, rows, 0, terms[t].k, packed_a + tile * tile_floats + a_at[t]);
      }
    }
  });
  // Each core packs every term's B for a group of its panels (kept in L2), then runs each C tile
  // through all the terms in one kernel call while it stays in L1: C goes to memory once, not once
  // per term.
  split_range(panels, 128 / kNr, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<float> packed_b_buffer;
    packed_b_buffer.resize(static_cast<size_t>(Isa::kPanelsPerGroup * b_floats) + kLine);
    float* const packed_b = aligned(packed_b_buffer.data());
    std::vector<float*> b_at(terms.size());  // each term's panels: [term][panel][p][kNr]
    std::vector<int64_t> ks;
    std::vector<const float*> as(terms.size()), bs(terms.size());  // one tile's and panel's
    std::vector<Pieces> term_b;
    for (const SumTerm& t : terms) {
      term_b.push_back(Pieces::dense(t.k, n, t.b));
      ks.push_back(t.k);
    }
    for (int64_t jg = j0; jg < j1; jg += Isa::kPanelsPerGroup) {
      const int64_t jn = std::min(j1, jg + Isa::kPanelsPerGroup);
      float* next = packed_b;
      for (size_t t = 0; t < terms.size(); ++t) {
        b_at[t] = next;
        pack_b<Isa>(false, terms[t].k, n, term_b[t], 0, next, terms[t].k * kNr, jg, jn);
        next += (jn - jg) * terms[t].k * kNr;
      }
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int rows = static_cast<int>(std::min<int64_t>(kMr, m - tile * kMr));
        const float* a = packed_a + tile * tile_floats;
        for (int64_t j = jg; j < jn; ++j) {
          const int cols = static_cast<int>(std::min<int64_t>(kNr, n - j * kNr));
          for (size_t t = 0; t < terms.size(); ++t) {
            as[t] = a + a_at[t];
            bs[t] = b_at[t] + (j - jg) * terms[t].k * kNr;
          }
          Isa::kKernels[rows](static_cast<int>(terms.size()), ks.data(), as.data(), bs.data(),
                              c + tile * kMr * n + j * kNr, n, cols, false);
        }
      }
    }
  });
}

std::atomic<bool> prefer_avx2{false};

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

bool use_avx512() { return has_avx512() && !prefer_avx2.load(std::memory_order_relaxed); }

}  // namespace

bool packed_gemm_supported() {
  static const bool yes = has_avx512() || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return yes;
}

void packed_gemm_prefer_avx2(bool yes) { prefer_avx2 = yes; }

Pieces Pieces::dense(int64_t rows, int64_t cols, const float* data) { return Pieces{{0, rows}, {0, cols}, {data}}; }

size_t Pieces::row_piece(int64_t r) const {
  return static_cast<size_t>(std::upper_bound(row_at.begin() + 1, row_at.end() - 1, r) - row_at.begin() - 1);
}

size_t Pieces::col_piece(int64_t c) const {
  return static_cast<size_t>(std::upper_bound(col_at.begin() + 1, col_at.end() - 1, c) - col_at.begin() - 1);
}

void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const float* b, const std::vector<RowBlock>& blocks) {
  packed_gemm(trans_a, trans_b, k, n, Pieces::dense(trans_b ? n : k, trans_b ? k : n, b), blocks);
}

void packed_gemm(bool trans_a, bool trans_b, int64_t k, int64_t n, const Pieces& b, const std::vector<RowBlock>& blocks) {
  if (b.rows() != (trans_b ? n : k) || b.cols() != (trans_b ? k : n))
    throw Error("packed_gemm: B's pieces make a " + std::to_string(b.rows()) + " x " + std::to_string(b.cols()) +
                " matrix, not the product's");
  if (n == 0) return;
  if (k == 0) {
    for (const RowBlock& r : blocks) std::fill(r.c, r.c + r.m * n, 0.0f);
    return;
  }
  if (!packed_gemm_supported()) throw Error("packed_gemm: this CPU has neither AVX-512F nor AVX2 with FMA");
  if (use_avx512()) return run_packed_gemm<Avx512>(trans_a, trans_b, k, n, b, blocks);
  run_packed_gemm<Avx2>(trans_a, trans_b, k, n, b, blocks);
}

int64_t packed_gemm_sum_max_k() { return kKc; }

void packed_gemm_sum(int64_t m, int64_t n, const std::vector<SumTerm>& terms, float* c) {
  if (m == 0 || n == 0) return;
  if (terms.empty()) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  for (const SumTerm& t : terms) {
    if (t.k < 0 || t.k > kKc) throw ValueError("packed_gemm_sum: a term's contraction of " + std::to_string(t.k) +
                                               " is beyond one k block (" + std::to_string(kKc) + ")");
  }
  if (!packed_gemm_supported()) throw Error("packed_gemm_sum: this CPU has neither AVX-512F nor AVX2 with FMA");
  if (use_avx512()) return run_packed_gemm_sum<Avx512>(m, n, terms, c);
  run_packed_gemm_sum<Avx2>(m, n, terms, c);
}

}  // namespace tessel::ops::detail
