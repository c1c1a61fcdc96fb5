#include "tessel/ops/detail/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"

namespace tessel::ops::detail {

namespace {

// Tile of C per kernel call: kMr rows by kNr columns (two 16-lane registers), 28 accumulators.
// Sizes measured on the project's Zen 4 VM (see multiply_panels): k blocks of 256, so a packed A
// tile (14 KiB) stays in L1 while a group of B panels passes it.
constexpr int kMr = 14;
constexpr int kNr = 32;
constexpr int64_t kKc = 256;
// How far ahead (in k) the kernel fetches B: its panels come from L2.
constexpr int64_t kPrefetch = 16;
// Panels of B a core keeps in L2 while tiles of A pass them (256 KiB of a full k block).
constexpr int64_t kPanelsPerGroup = 8;

// Floats per cache line: packed panels start on a line, so no 64-byte load straddles two.
constexpr size_t kLine = 16;
float* aligned(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

int64_t panels_of(int64_t n) { return (n + kNr - 1) / kNr; }
int64_t k_blocks_of(int64_t k) { return (k + kKc - 1) / kKc; }

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

// B's k block kb, panels [j0, j1), packed as [panel][p][kNr] with panel j - j0 at out + (j - j0)
// * stride, the columns past n zero. A stored B^T is packed in 16 x 16 blocks transposed in
// registers (and pack_a's rows of A likewise): packed element by element at the baseline's SSE
// width, the two packings had 9.5% of the samples of DotReluDot's fsdp=8 step, now 7%. B is read
// in place from its pieces: a 16 x 16 block or a panel's row that crosses pieces is copied in
// stretches (element by element for the transposed blocks; shards of 16 and more rows never do).
__attribute__((target("avx512f"))) void pack_b(bool trans_b, int64_t k, int64_t n, const Pieces& b, int64_t kb,
                                               float* out, int64_t stride, int64_t j0, int64_t j1) {
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
          const float* src = b.at(i, stretches[0].piece, r, c0);
          _mm512_storeu_ps(d, _mm512_loadu_ps(src));
          _mm512_storeu_ps(d + 16, _mm512_loadu_ps(src + 16));
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
    // Whole 16 x 16 blocks in registers where their 16 k lie in one piece, then what they leave
    // (past n's last 16, past k's, across pieces) one by one.
    const int64_t block_cols = cols / 16 * 16;
    for (int64_t p = 0; p < kc; p += 16) {
      const size_t jp = b.col_piece(p0 + p);
      const int64_t depth = std::min<int64_t>(16, kc - p);
      const bool whole = depth == 16 && p0 + p + 16 <= b.col_at[jp + 1];
      for (int64_t c = 0; c < cols; c += 16) {
        if (whole && c < block_cols) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(b.at(row_piece[c + i], jp, c0 + c + i, p0 + p));
          transpose16(r);
          for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (p + i) * kNr + c, r[i]);
          continue;
        }
        for (int64_t cc = c; cc < std::min<int64_t>(cols, c + 16); ++cc)
          for (int64_t q = p; q < p + depth; ++q) dst[q * kNr + cc] = element(c0 + cc, p0 + q);
      }
    }
  }
}

// A tile's rows of A's k block as [p][kMr], the rows past `rows` zero: from the tile's first row
// of A [m, k] (lda = k), or when trans_a from its first column of the stored A^T [k, m] (lda = m).
__attribute__((target("avx512f"))) void pack_a(bool trans_a, const float* a, int64_t lda, int64_t rows, int64_t p0,
                                               int64_t kc, float* out) {
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1), tile = (1u << kMr) - 1;
  if (trans_a) {
    for (int64_t p = 0; p < kc; ++p)
      _mm512_mask_storeu_ps(out + p * kMr, tile, _mm512_maskz_loadu_ps(valid, a + (p0 + p) * lda));
    return;
  }
  // Rows of A: 16 k at a time, transposed in registers (the rows past `rows` zero).
  int64_t p = 0;
  for (; p + 16 <= kc; p += 16) {
    __m512 r[16];
    for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(a + i * lda + p0 + p) : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t i = 0; i < 16; ++i) _mm512_mask_storeu_ps(out + (p + i) * kMr, tile, r[i]);
  }
  for (; p < kc; ++p) {
    for (int64_t r = 0; r < rows; ++r) out[p * kMr + r] = a[r * lda + p0 + p];
    for (int64_t r = rows; r < kMr; ++r) out[p * kMr + r] = 0.0f;
  }
}

// C tile (R rows, `cols` <= kNr columns) = or += the sum of `terms` products in order, term t
// being as[t] [ks[t]][kMr] times bs[t] [ks[t]][kNr]: each a fused multiply-add chain over p from
// zero, then stored (the first, unless `add`) or added to C. Independent of R. One call for all
// the terms of a sum (packed_gemm_sum's devices): a call per term cost 10% of those products.
template <int R>
__attribute__((target("avx512f"))) void kernel(int terms, const int64_t* ks, const float* const* as,
                                               const float* const* bs, float* c, int64_t ldc, int cols, bool add) {
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

using Kernel = void (*)(int, const int64_t*, const float* const*, const float* const*, float*, int64_t, int, bool);
constexpr Kernel kKernels[kMr + 1] = {nullptr,   kernel<1>, kernel<2>,  kernel<3>,  kernel<4>,
                                      kernel<5>, kernel<6>, kernel<7>,  kernel<8>,  kernel<9>,
                                      kernel<10>, kernel<11>, kernel<12>, kernel<13>, kernel<14>};

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
void multiply_panels(bool trans_a, int64_t k, int64_t n, int64_t kb, const float* packed_b,
                     const std::vector<Tile>& tiles, int64_t j0, int64_t j1) {
  constexpr size_t kTilesPerGroup = 40;
  thread_local std::vector<float> packed_a_buffer;
  packed_a_buffer.resize(kTilesPerGroup * kKc * kMr + kLine);
  float* const packed_a = aligned(packed_a_buffer.data());
  const int64_t p0 = kb * kKc, kc = std::min(kKc, k - p0);
  for (size_t g0 = 0; g0 < tiles.size(); g0 += kTilesPerGroup) {
    const size_t g1 = std::min(tiles.size(), g0 + kTilesPerGroup);
    for (size_t t = g0; t < g1; ++t) {
      pack_a(trans_a, tiles[t].a, tiles[t].lda, tiles[t].rows, p0, kc, packed_a + (t - g0) * kKc * kMr);
    }
    for (int64_t jg = j0; jg < j1; jg += kPanelsPerGroup) {
      for (size_t t = g0; t < g1; ++t) {
        for (int64_t j = jg; j < std::min(j1, jg + kPanelsPerGroup); ++j) {
          const float* panel = packed_b + j * kKc * kNr;
          const int cols = static_cast<int>(std::min<int64_t>(kNr, n - j * kNr));
          const float* a = packed_a + (t - g0) * kKc * kMr;
          kKernels[tiles[t].rows](1, &kc, &a, &panel, tiles[t].c + j * kNr, n, cols, kb > 0);
        }
      }
    }
  }
}

}  // namespace

bool packed_gemm_supported() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

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
  const int64_t panels = panels_of(n);
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
  split_range(panels, 4, [&](int64_t j0, int64_t j1) {
    for (int64_t kb = 0; kb < k_blocks_of(k); ++kb) {
      pack_b(trans_b, k, n, b, kb, packed + j0 * kKc * kNr, kKc * kNr, j0, j1);
      multiply_panels(trans_a, k, n, kb, packed, tiles, j0, j1);
    }
  });
}

int64_t packed_gemm_sum_max_k() { return kKc; }

void packed_gemm_sum(int64_t m, int64_t n, const std::vector<SumTerm>& terms, float* c) {
  if (m == 0 || n == 0) return;
  if (terms.empty()) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  // A tile's rows of every term, packed once for all the panels: [tile][term][p][kMr].
  std::vector<int64_t> a_at;  // each term's offset inside a tile's stretch
  int64_t tile_floats = 0, b_floats = 0;
  for (const SumTerm& t : terms) {
    if (t.k < 0 || t.k > kKc) throw ValueError("packed_gemm_sum: a term's contraction of " + std::to_string(t.k) +
                                               " is beyond one k block (" + std::to_string(kKc) + ")");
    a_at.push_back(tile_floats);
    tile_floats += t.k * kMr;
    b_floats += t.k * kNr;
  }
  const int64_t tiles = (m + kMr - 1) / kMr, panels = panels_of(n);
  thread_local std::vector<float> packed_a_buffer;
  packed_a_buffer.resize(static_cast<size_t>(tiles * tile_floats) + kLine);
  float* const packed_a = aligned(packed_a_buffer.data());
  split_range(tiles, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int rows = static_cast<int>(std::min<int64_t>(kMr, m - tile * kMr));
      for (size_t t = 0; t < terms.size(); ++t) {
        // An empty term (a device without rows) may have no buffer at all: nothing to pack.
        if (terms[t].k > 0) pack_a(true, terms[t].a + tile * kMr, m, rows, 0, terms[t].k, packed_a + tile * tile_floats + a_at[t]);
      }
    }
  });
  // Each core packs every term's B for a group of its panels (kept in L2), then runs each C tile
  // through all the terms in one kernel call while it stays in L1: C goes to memory once, not once
  // per term.
  split_range(panels, 4, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<float> packed_b_buffer;
    packed_b_buffer.resize(static_cast<size_t>(kPanelsPerGroup * b_floats) + kLine);
    float* const packed_b = aligned(packed_b_buffer.data());
    std::vector<float*> b_at(terms.size());  // each term's panels: [term][panel][p][kNr]
    std::vector<int64_t> ks;
    std::vector<const float*> as(terms.size()), bs(terms.size());  // one tile's and panel's
    std::vector<Pieces> term_b;
    for (const SumTerm& t : terms) {
      term_b.push_back(Pieces::dense(t.k, n, t.b));
      ks.push_back(t.k);
    }
    for (int64_t jg = j0; jg < j1; jg += kPanelsPerGroup) {
      const int64_t jn = std::min(j1, jg + kPanelsPerGroup);
      float* next = packed_b;
      for (size_t t = 0; t < terms.size(); ++t) {
        b_at[t] = next;
        pack_b(false, terms[t].k, n, term_b[t], 0, next, terms[t].k * kNr, jg, jn);
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
          kKernels[rows](static_cast<int>(terms.size()), ks.data(), as.data(), bs.data(), c + tile * kMr * n + j * kNr, n,
                         cols, false);
        }
      }
    }
  });
}

}  // namespace tessel::ops::detail
