// Internal: row kernels of the fused normalizations (softmax, RMSNorm, attention). Row
// reductions run in interleaved lanes joined in a fixed order: they vectorize, and give the same
// bits on every machine and mesh.
#pragma once

#include <cstdint>

namespace tessel::ops::detail {

// A row's reduction in kLanes interleaved partial results (element i goes to lane i % kLanes),
// joined pairwise in a fixed order at the end: one dependency chain per lane instead of one for the
// row, so the loop vectorizes (a left-to-right sum of a 128-element row waited on every add), and
// the result is the same on every machine and mesh.
constexpr int kLanes = 16;

// Always inlined: a caller built for a wider instruction set (a vector clone) vectorizes it too.
template <class A, class Term, class Join>
[[gnu::always_inline]] inline A reduce_lanes(int64_t n, A init, Term&& term, Join&& join) {
  A acc[kLanes];
  for (A& a : acc) a = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = join(acc[j], term(i + j));
  for (int j = 0; i + j < n; ++j) acc[j] = join(acc[j], term(i + j));
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] = join(acc[j], acc[j + width]);
  return acc[0];
}

constexpr auto kPlus = [](auto a, auto b) { return a + b; };

}  // namespace tessel::ops::detail
