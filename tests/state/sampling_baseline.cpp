// The sampling kernels once more, without the x86 kernels and in namespace
// tessel::detail_baseline, so a test can check that every ISA version gives the same bits.
#define TESSEL_SAMPLING_BASELINE_ONLY
#define detail detail_baseline
#include "../../src/tessel/state/detail/sampling.cpp"  // NOLINT(bugprone-suspicious-include)
#undef detail
#undef TESSEL_VECTOR_CLONES

// The library's own SampleSpec, for the wrapper's signature: sampling.h was included above under
// the renamed namespace, so #pragma once would skip it now. This copy must stay identical.
namespace tessel::detail {
struct SampleSpec {
  enum class Kind { kUniform, kErfinv } kind = Kind::kUniform;
  float lo = 0, hi = 1, scale = 1;
  float clamp_lo = -3.4e38f, clamp_hi = 3.4e38f;
};
}  // namespace tessel::detail

namespace tessel::testing {
// The baseline kernel behind a spec of the library's own type (the two types are identical).
void baseline_sample_f32(const ArsKey& key, uint64_t first, size_t n, const detail::SampleSpec& spec, float* out);
}  // namespace tessel::testing

static_assert(sizeof(tessel::detail::SampleSpec) == sizeof(tessel::detail_baseline::SampleSpec));

void tessel::testing::baseline_sample_f32(const ArsKey& key, uint64_t first, size_t n,
                                          const detail::SampleSpec& spec, float* out) {
  detail_baseline::SampleSpec s{spec.kind == detail::SampleSpec::Kind::kUniform
                                    ? detail_baseline::SampleSpec::Kind::kUniform
                                    : detail_baseline::SampleSpec::Kind::kErfinv,
                                spec.lo, spec.hi, spec.scale, spec.clamp_lo, spec.clamp_hi};
  detail_baseline::sample_f32(key, first, n, s, out);
}
