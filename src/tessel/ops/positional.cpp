// Positions in attention: rotary embeddings (rope, llama_rope, yarn_rope) and the causal mask.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <numeric>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/detail/rope_kernels.h"
#include "tessel/ops/detail/rope_tables.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel::ops {
namespace {

using namespace detail;

// Rotary position embedding on [..., seq, heads, head_dim] (MaxText's layout: the first and
// second halves of head_dim are the pair), positions = global sequence index. sign = -1 rotates
// back (the gradient).
struct RopeStyle {
  double max_timescale = 10000;
  bool interleaved = false;     // pairs (2k, 2k+1), else (k, k + head_dim / 2)
  bool llama3_scaling = false;  // Llama 3.1's frequency scaling
  std::optional<YarnRope> yarn;  // YaRN's frequencies (max_timescale is yarn's)
  double scale = 1;              // the result times scale
};

// YaRN's frequency of pair k (MaxText's YarnRotaryEmbedding.freqs_cis, after DeepSeek-V3): the
// base frequency blended towards base / factor below the correction range.
double yarn_frequency(const YarnRope& y, int64_t k, int64_t d) {
  const double base = 1.0 / std::pow(y.max_timescale, 2.0 * static_cast<double>(k) / static_cast<double>(d));
  auto correction = [&](double rotations) {
    return static_cast<double>(d) *
           std::log(static_cast<double>(y.original_max_position) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(y.max_timescale));
  };
  double low = correction(y.beta_fast), high = correction(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
  const double smooth = 1 - ramp;
  return base / y.factor * (1 - smooth) + base * smooth;
}

// The angular frequency of pair k of a head of `d`: 1 / max_timescale^(2k/d), then Llama 3.1's
// scaling (MaxText's LLaMARotaryEmbedding._apply_scaling_factor).
double rope_frequency(const RopeStyle& style, int64_t k, int64_t d) {
  if (style.yarn) return yarn_frequency(*style.yarn, k, d);
  const double freq = 1.0 / std::pow(style.max_timescale, 2.0 * static_cast<double>(k) / static_cast<double>(d));
  if (!style.llama3_scaling) return freq;
  constexpr double kFactor = 8, kLow = 1, kHigh = 4, kOriginal = 8192;
  const double wavelen = 2 * std::numbers::pi / freq;
  if (wavelen < kOriginal / kHigh) return freq;
  if (wavelen > kOriginal / kLow) return freq / kFactor;
  const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
  return (1 - smooth) * freq / kFactor + smooth * freq;
}

// The cached table of a style's frequencies for positions [0, seq) of heads of d.
template <class T>
std::shared_ptr<const RopeTable<T>> style_table(WorkerPool& pool, int64_t seq, int64_t d, double sign,
                                                const RopeStyle& style) {
  if (!style.yarn && !style.llama3_scaling)
    return rope_table<T>(pool, seq, default_rope_frequencies(style.max_timescale, d), sign);
  std::vector<double> freq(static_cast<size_t>(d / 2));
  for (int64_t k = 0; k < d / 2; ++k) freq[k] = rope_frequency(style, k, d);
  return rope_table<T>(pool, seq, freq, sign);
}

// `scale` multiplies the rotation's output, or with `scale_input` its input (the gradient).
template <class T>
void rope_block(const Box& box, size_t seq_dim, const T* in, T* out, const RopeTable<T>& table, bool interleaved,
                T scale, bool scale_input) {
  const size_t r = box.rank();
  const int64_t d = box.extent(r - 1), half = d / 2;
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < seq_dim; ++i) outer *= box.extent(i);
  for (size_t i = seq_dim + 1; i + 1 < r; ++i) inner *= box.extent(i);
  const int64_t seq = box.extent(seq_dim);
  detail::split_range(seq, 4, [&](int64_t s_lo, int64_t s_hi) {
    for (int64_t s = s_lo; s < s_hi; ++s) {
      const size_t at = static_cast<size_t>((box.start(seq_dim) + s) * half);
      for (int64_t a = 0; a < outer; ++a) {
        const int64_t off = (a * seq + s) * inner * d;
        detail::rope_heads(in + off, out + off, table.cos.data() + at, table.sin.data() + at, inner, half, interleaved,
                           scale, scale_input);
      }
    }
  });
}

Tensor rope_raw(const Tensor& x, size_t seq_dim, double sign, const RopeStyle& style) {
  Dims d = dims_of(x.sharding(), x.rank());
  Tensor placed = x;
  if (!d.back().empty()) {  // a rotation pairs elements half a head apart: head_dim stays whole
    d.back() = {};
    placed = reshard_raw(reduce_raw(x, nullptr), with_dims(x.mesh(), d));
  }
  Tensor out;
  dispatch_float(placed.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto table = placed.is_abstract() ? std::make_shared<const RopeTable<T>>()
                                            : style_table<T>(placed.shards().runtime().pool(), placed.shape()[seq_dim],
                                                            placed.shape()[placed.rank() - 1], sign, style);
    out = output(placed, placed.shape(), placed.dtype(), placed.sharding(), placed.partial(),
                  [&](int64_t device, const Box& box, std::byte* o) {
                    // The gradient (sign -1) is scaled before it is rotated back, as scale's own
                    // gradient would come first.
                    rope_block<T>(box, seq_dim, reinterpret_cast<const T*>(block(placed, device)),
                                  reinterpret_cast<T*>(o), *table, style.interleaved, static_cast<T>(style.scale),
                                  sign < 0);
                  });
  });
  return out;
}

// x with entries above the diagonal of the last two dimensions (key > query) set to `fill`.
Tensor mask_raw(const Tensor& x_in, double fill, int64_t window) {
  const Tensor x = reduce_raw(x_in, nullptr);
  const size_t r = x.rank();
  return output(x, x.shape(), x.dtype(), x.sharding(), {}, [&](int64_t device, const Box& box, std::byte* o) {
    const int64_t nq = box.extent(r - 2), nk = box.extent(r - 1);
    const int64_t q0 = box.start(r - 2), k0 = box.start(r - 1);
    const int64_t planes = nq * nk == 0 ? 0 : box.volume() / (nq * nk);
    dispatch_float(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = reinterpret_cast<const T*>(block(x, device));
      T* out = reinterpret_cast<T*>(o);
      const T f = static_cast<T>(fill);
      // Row (p, q) keeps the keys k with key position - query position <= 0 and, with a window,
      // > -window: one kept span [lo, hi) between two filled ones. Rows are split over the cores.
      detail::split_range(planes * nq, 16, [&](int64_t row_lo, int64_t row_hi) {
        for (int64_t row = row_lo; row < row_hi; ++row) {
          const int64_t q = row % nq, off = row * nk;
          const int64_t hi = std::clamp<int64_t>(q0 + q - k0 + 1, 0, nk);
          const int64_t lo = window > 0 ? std::clamp<int64_t>(q0 + q - k0 - window + 1, 0, hi) : 0;
          std::fill(out + off, out + off + lo, f);
          std::copy(in + off + lo, in + off + hi, out + off + lo);
          std::fill(out + off + hi, out + off + nk, f);
        }
      });
    });
  });
}

}  // namespace

Tensor causal_mask(const Tensor& x, int64_t window) {
  check_float(x, "causal_mask");
  if (x.rank() < 2) throw ValueError("causal_mask needs [..., query, key], got " + x.to_string());
  if (window < 0) throw ValueError("causal_mask: the window must not be negative, got " + std::to_string(window));
  // MaxText's mask value: far below any score, yet finite so a fully masked row stays a number.
  const double fill = -0.7 * (x.dtype() == DType::kF32 ? std::numeric_limits<float>::max()
                                                        : std::numeric_limits<double>::max());
  return record(mask_raw(x, fill, window), {x},
                [window](const Tensor& g) { return std::vector<Tensor>{mask_raw(g, 0.0, window)}; });
}

namespace {

Tensor rope_styled(const Tensor& x, size_t seq_dim, const RopeStyle& style) {
  check_float(x, "rope");
  if (!(style.max_timescale > 0))
    throw ValueError("rope: max_timescale must be positive, got " + std::to_string(style.max_timescale));
  if (x.rank() < 3 || seq_dim + 2 >= x.rank() || x.shape()[x.rank() - 1] % 2 != 0) {
    throw ValueError("rope needs [..., seq, heads, head_dim] with seq before heads and an even head_dim, got " +
                     x.to_string());
  }
  return record(rope_raw(x, seq_dim, 1.0, style), {x}, [seq_dim, style](const Tensor& g) {
    return std::vector<Tensor>{rope_raw(g, seq_dim, -1.0, style)};
  });
}

}  // namespace

Tensor rope(const Tensor& x, size_t seq_dim, double max_timescale, double scale) {
  RopeStyle style;
  style.max_timescale = max_timescale;
  style.scale = scale;
  return rope_styled(x, seq_dim, style);
}

Tensor yarn_rope(const Tensor& x, size_t seq_dim, const YarnRope& yarn) {
  if (!(yarn.factor > 0) || !(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) || yarn.original_max_position < 1)
    throw ValueError("yarn_rope: factor, beta_fast, beta_slow and original_max_position must be positive");
  // attention_scaling multiplies in the rotation's pass: the same bits as after the reordering below.
  const double attention_scale = yarn.attention_scaling && yarn.factor > 1 ? 0.1 * std::log(yarn.factor) + 1.0 : 1.0;
  Tensor y = rope_styled(x, seq_dim,
                         {.max_timescale = yarn.max_timescale, .interleaved = yarn.interleave, .yarn = yarn,
                          .scale = attention_scale});
  if (yarn.interleave) {
    // Rotated pairs (2k, 2k+1) come out as MaxText's complex numbers do: real parts, then imaginary.
    const size_t r = y.rank();
    std::vector<int64_t> pairs(y.shape().dims().begin(), y.shape().dims().end());
    const int64_t d = pairs.back();
    pairs.back() = d / 2;
    pairs.push_back(2);
    std::vector<size_t> perm(r + 1);
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[r - 1], perm[r]);
    y = reshape(transpose(reshape(y, Shape(pairs)), perm), x.shape());
  }
  return y;
}

Tensor llama_rope(const Tensor& x, size_t seq_dim, double max_timescale, bool llama3_scaling) {
  RopeStyle style;
  style.max_timescale = max_timescale;
  style.interleaved = true;
  style.llama3_scaling = llama3_scaling;
  return rope_styled(x, seq_dim, style);
}

}  // namespace tessel::ops
