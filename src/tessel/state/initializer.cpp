#include "tessel/state/initializer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cerrno>
#include <cstdlib>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/half.h"
#include "tessel/detail/text_util.h"
#include "tessel/state/detail/sampling.h"
#include "tessel/state/random.h"

namespace tessel {
namespace {

// Standard deviation of a standard normal truncated to [-2, 2] (JAX's constant).
constexpr double kTruncatedStd = .87962566103423978;

void store(DType dtype, double v, std::byte* out) {
  switch (dtype) {
    case DType::kF32: { float f = static_cast<float>(v); std::memcpy(out, &f, 4); return; }
    case DType::kF64: std::memcpy(out, &v, 8); return;
    case DType::kBF16: { uint16_t h = f32_to_bf16(static_cast<float>(v)); std::memcpy(out, &h, 2); return; }
    case DType::kF16: { uint16_t h = f32_to_f16(static_cast<float>(v)); std::memcpy(out, &h, 2); return; }
    case DType::kF8E4M3FN: { uint8_t b = f32_to_f8e4m3fn(static_cast<float>(v)); std::memcpy(out, &b, 1); return; }
    case DType::kF8E5M2: { uint8_t b = f32_to_f8e5m2(static_cast<float>(v)); std::memcpy(out, &b, 1); return; }
    default: break;
  }
}

// Every element of `out` set to `value` in `dtype` (integers truncate, bool is value != 0).
void fill_constant(DType dtype, double value, std::span<std::byte> out) {
  const size_t item = item_size(dtype);
  std::byte one[8] = {};
  if (is_floating(dtype)) {
    store(dtype, value, one);
  } else {
    int64_t v = dtype == DType::kBool ? value != 0 : static_cast<int64_t>(value);
    std::memcpy(one, &v, item);  // little endian: the low bytes
  }
  for (size_t k = 0; k < out.size(); k += item) std::memcpy(out.data() + k, one, item);
}

std::string_view mode_name(FanMode m) {
  switch (m) {
    case FanMode::kFanIn: return "fan_in";
    case FanMode::kFanOut: return "fan_out";
    case FanMode::kFanAvg: return "fan_avg";
  }
  return "?";
}

std::string_view distribution_name(Distribution d) {
  switch (d) {
    case Distribution::kTruncatedNormal: return "truncated_normal";
    case Distribution::kNormal: return "normal";
    case Distribution::kUniform: return "uniform";
  }
  return "?";
}

}  // namespace

std::pair<double, double> compute_fans(const Shape& shape, const Fans& fans) {
  const size_t rank = shape.rank();
  Fans f = fans;
  if (f.in_axes.empty() && f.out_axes.empty()) {
    // JAX's defaults (in = -2, out = -1), taken among the dimensions that are not batch axes.
    std::vector<size_t> rest;
    for (size_t d = 0; d < rank; ++d)
      if (std::find(f.batch_axes.begin(), f.batch_axes.end(), d) == f.batch_axes.end()) rest.push_back(d);
    if (rest.empty()) return {1.0, 1.0};
    if (rest.size() == 1) return {static_cast<double>(shape[rest[0]]), static_cast<double>(shape[rest[0]])};
    f.in_axes = {rest[rest.size() - 2]};
    f.out_axes = {rest.back()};
  }
  std::vector<int> role(rank, 0);  // 0 receptive field, 1 in, 2 out, 3 batch
  auto mark = [&](const std::vector<size_t>& axes, int r, const char* what) {
    for (size_t a : axes) {
      if (a >= rank)
        throw ValueError(fmt::format("{} axis {} is out of range for shape {}", what, a, shape.to_string()));
      if (role[a] != 0)
        throw ValueError(fmt::format("axis {} of shape {} is declared twice among in/out/batch axes", a, shape.to_string()));
      role[a] = r;
    }
  };
  mark(f.in_axes, 1, "fan-in");
  mark(f.out_axes, 2, "fan-out");
  mark(f.batch_axes, 3, "batch");
  double in = 1, out = 1, receptive = 1;
  for (size_t d = 0; d < rank; ++d) {
    auto n = static_cast<double>(shape[d]);
    if (role[d] == 1) in *= n;
    else if (role[d] == 2) out *= n;
    else if (role[d] == 0) receptive *= n;
  }
  return {in * receptive, out * receptive};
}

Initializer Initializer::zeros() { return Initializer(Kind::kZeros, 0); }
Initializer Initializer::ones() { return Initializer(Kind::kOnes, 1); }
Initializer Initializer::constant(double value) { return Initializer(Kind::kConstant, value); }

Initializer Initializer::normal(double stddev) {
  if (!(stddev >= 0)) throw ValueError(fmt::format("normal initializer: stddev must be >= 0, got {}", stddev));
  return Initializer(Kind::kNormal, stddev);
}

Initializer Initializer::truncated_normal(double stddev, double lower, double upper) {
  if (!(stddev >= 0)) throw ValueError(fmt::format("truncated_normal initializer: stddev must be >= 0, got {}", stddev));
  if (!(lower < upper))
    throw ValueError(fmt::format("truncated_normal initializer: need lower < upper, got [{}, {}]", lower, upper));
  return Initializer(Kind::kTruncatedNormal, stddev, lower, upper);
}

Initializer Initializer::uniform(double scale) { return Initializer(Kind::kUniform, scale); }

Initializer Initializer::variance_scaling(double scale, FanMode mode, Distribution distribution) {
  if (!(scale > 0)) throw ValueError(fmt::format("variance_scaling initializer: scale must be > 0, got {}", scale));
  Initializer init(Kind::kVarianceScaling, scale);
  init.mode_ = mode;
  init.distribution_ = distribution;
  return init;
}

Initializer Initializer::by_name(std::string_view name) {
  if (name == "zeros") return zeros();
  if (name == "ones") return ones();
  if (name == "normal") return normal();
  if (name == "truncated_normal") return truncated_normal();
  if (name == "uniform") return uniform();
  if (name == "lecun_normal") return lecun_normal();
  if (name == "lecun_uniform") return lecun_uniform();
  if (name == "he_normal" || name == "kaiming_normal") return he_normal();
  if (name == "he_uniform" || name == "kaiming_uniform") return he_uniform();
  if (name == "glorot_normal" || name == "xavier_normal") return glorot_normal();
  if (name == "glorot_uniform" || name == "xavier_uniform") return glorot_uniform();
  throw ValueError(fmt::format(
      "unknown initializer '{}' (known: zeros, ones, normal, truncated_normal, uniform, "
      "lecun_normal, lecun_uniform, he_normal, he_uniform, glorot_normal, glorot_uniform)", name));
}

namespace {

using text_util::trim;

// The arguments of "name(a, k=b, ...)", matched to `keys` by position or keyword.
std::vector<std::string> call_arguments(std::string_view text, std::string_view args,
                                        const std::vector<std::string_view>& keys) {
  std::vector<std::string> values(keys.size());
  std::vector<bool> given(keys.size(), false);
  if (trim(args).empty()) return values;
  size_t position = 0;
  bool keyword_seen = false;
  for (std::string_view item : text_util::split_commas(args)) {
    size_t eq = item.find('=');
    size_t slot = position;
    if (eq != std::string_view::npos) {
      std::string_view key = trim(item.substr(0, eq));
      item = trim(item.substr(eq + 1));
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end())
        throw ValueError(fmt::format("initializer '{}': unknown argument '{}' (known: {})", text, key,
                                     fmt::join(keys, ", ")));
      slot = static_cast<size_t>(it - keys.begin());
      keyword_seen = true;
    } else {
      if (keyword_seen)
        throw ValueError(fmt::format("initializer '{}': positional argument after a keyword", text));
      ++position;
    }
    if (slot >= keys.size())
      throw ValueError(fmt::format("initializer '{}': at most {} arguments", text, keys.size()));
    if (item.empty()) throw ValueError(fmt::format("initializer '{}': empty argument", text));
    if (given[slot]) throw ValueError(fmt::format("initializer '{}': '{}' given twice", text, keys[slot]));
    given[slot] = true;
    values[slot] = std::string(item);
  }
  return values;
}

double number_argument(std::string_view text, std::string_view key, const std::string& value, double fallback) {
  if (value.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size() || errno == ERANGE || !std::isfinite(v))
    throw ValueError(fmt::format("initializer '{}': {} must be a finite number, got '{}'", text, key, value));
  return v;
}

}  // namespace

Initializer Initializer::parse(std::string_view text) {
  std::string_view t = trim(text);
  size_t open = t.find('(');
  if (open == std::string_view::npos) return by_name(t);
  if (t.back() != ')') throw ValueError(fmt::format("initializer '{}': missing ')'", text));
  std::string_view name = trim(t.substr(0, open));
  std::string_view args = t.substr(open + 1, t.size() - open - 2);
  if (name == "normal") {
    auto a = call_arguments(text, args, {"stddev"});
    return normal(number_argument(text, "stddev", a[0], 1e-2));
  }
  if (name == "truncated_normal") {
    auto a = call_arguments(text, args, {"stddev", "lower", "upper"});
    return truncated_normal(number_argument(text, "stddev", a[0], 1e-2), number_argument(text, "lower", a[1], -2),
                            number_argument(text, "upper", a[2], 2));
  }
  if (name == "uniform") {
    auto a = call_arguments(text, args, {"scale"});
    return uniform(number_argument(text, "scale", a[0], 1e-2));
  }
  if (name == "constant") {
    auto a = call_arguments(text, args, {"value"});
    if (a[0].empty()) throw ValueError(fmt::format("initializer '{}': constant needs a value", text));
    return constant(number_argument(text, "value", a[0], 0));
  }
  if (name == "variance_scaling") {
    auto a = call_arguments(text, args, {"scale", "mode", "distribution"});
    FanMode mode = FanMode::kFanIn;
    if (a[1] == "fan_out") mode = FanMode::kFanOut;
    else if (a[1] == "fan_avg") mode = FanMode::kFanAvg;
    else if (!a[1].empty() && a[1] != "fan_in")
      throw ValueError(fmt::format("initializer '{}': mode must be fan_in, fan_out or fan_avg, got '{}'", text, a[1]));
    Distribution dist = Distribution::kTruncatedNormal;
    if (a[2] == "normal") dist = Distribution::kNormal;
    else if (a[2] == "uniform") dist = Distribution::kUniform;
    else if (!a[2].empty() && a[2] != "truncated_normal")
      throw ValueError(fmt::format("initializer '{}': distribution must be truncated_normal, normal or uniform, "
                                   "got '{}'", text, a[2]));
    return variance_scaling(number_argument(text, "scale", a[0], 1.0), mode, dist);
  }
  if (trim(args).empty()) return by_name(name);
  throw ValueError(fmt::format("initializer '{}': '{}' takes no arguments", text, name));
}

std::string Initializer::to_string() const {
  switch (kind_) {
    case Kind::kZeros: return "zeros";
    case Kind::kOnes: return "ones";
    case Kind::kConstant: return fmt::format("constant({})", a_);
    case Kind::kNormal: return fmt::format("normal(stddev={})", a_);
    case Kind::kTruncatedNormal: return fmt::format("truncated_normal(stddev={}, lower={}, upper={})", a_, b_, c_);
    case Kind::kUniform: return fmt::format("uniform(scale={})", a_);
    case Kind::kVarianceScaling:
      return fmt::format("variance_scaling(scale={}, mode={}, distribution={})", a_, mode_name(mode_),
                         distribution_name(distribution_));
  }
  return "?";
}

void Initializer::fill(uint64_t seed, std::string_view path, const Shape& shape, DType dtype,
                       const Fans& fans, const Box& box, std::span<std::byte> out) const {
  const size_t item = item_size(dtype);
  if (box.rank() != shape.rank() || !Box::full(shape).contains(box))
    throw ValueError(fmt::format("{}: box {} does not lie in shape {}", path, box.to_string(), shape.to_string()));
  if (out.size() != static_cast<size_t>(box.volume()) * item)
    throw ValueError(fmt::format("{}: {} bytes given for box {} of {}, need {}", path, out.size(),
                                 box.to_string(), name(dtype), box.volume() * static_cast<int64_t>(item)));
  const bool constant = kind_ == Kind::kZeros || kind_ == Kind::kOnes || kind_ == Kind::kConstant;
  if (!constant && !is_floating(dtype))
    throw ValueError(fmt::format("{}: {} initializer needs a float dtype, not {}", path, to_string(), name(dtype)));
  if (box.empty()) return;

  if (constant) {
    fill_constant(dtype, a_, out);
    return;
  }
  const detail::SampleSpec spec = sample_spec(shape, fans, path);
  const ArsKey key = parameter_key(seed, path);
  // Walk the box row by row; the global index of each element is its offset in the full shape.
  // f32 is sampled in place; other float types through a small f32 staging buffer.
  constexpr int64_t kStage = 1024;
  float stage[kStage];
  const Box full = Box::full(shape);
  for_each_run(box, full, box, [&](int64_t global, int64_t local, int64_t count) {
    if (dtype == DType::kF32) {
      auto* dst = reinterpret_cast<float*>(out.data()) + local;
      detail::sample_f32(key, static_cast<uint64_t>(global), static_cast<size_t>(count), spec, dst);
      return;
    }
    for (int64_t done = 0; done < count; done += kStage) {
      const int64_t m = std::min(kStage, count - done);
      detail::sample_f32(key, static_cast<uint64_t>(global + done), static_cast<size_t>(m), spec, stage);
      std::byte* dst = out.data() + (local + done) * static_cast<int64_t>(item);
      for (int64_t j = 0; j < m; ++j) store(dtype, stage[j], dst + j * static_cast<int64_t>(item));
    }
  });
}

detail::SampleSpec Initializer::sample_spec(const Shape& shape, const Fans& fans, std::string_view path) const {
  using detail::SampleSpec;
  auto normal = [](double stddev) {
    SampleSpec s{.kind = SampleSpec::Kind::kErfinv, .lo = std::nextafter(-1.0f, 0.0f), .hi = 1.0f,
                 .scale = static_cast<float>(stddev)};
    return s;
  };
  // A standard normal conditioned on [lower, upper]: erfinv of a uniform between the bounds' CDF
  // values (JAX's method), times stddev, clamped strictly inside [lower, upper] times stddev.
  auto truncated = [](double stddev, double lower, double upper) {
    SampleSpec s{.kind = SampleSpec::Kind::kErfinv,
                 .lo = static_cast<float>(std::erf(lower / std::numbers::sqrt2)),
                 .hi = static_cast<float>(std::erf(upper / std::numbers::sqrt2)),
                 .scale = static_cast<float>(stddev)};
    if (stddev > 0) {
      s.clamp_lo = std::nextafter(static_cast<float>(lower * stddev), INFINITY);
      s.clamp_hi = std::nextafter(static_cast<float>(upper * stddev), -INFINITY);
    }
    return s;
  };
  auto uniform = [](double lo, double hi, double scale) {
    return SampleSpec{.kind = SampleSpec::Kind::kUniform, .lo = static_cast<float>(lo),
                      .hi = static_cast<float>(hi), .scale = static_cast<float>(scale)};
  };
  switch (kind_) {
    case Kind::kNormal: return normal(a_);
    case Kind::kTruncatedNormal: return truncated(a_, b_, c_);
    case Kind::kUniform: return uniform(0, 1, a_);
    case Kind::kVarianceScaling: {
      auto [fan_in, fan_out] = compute_fans(shape, fans);
      double n = mode_ == FanMode::kFanIn ? fan_in : mode_ == FanMode::kFanOut ? fan_out : (fan_in + fan_out) / 2;
      if (!(n > 0))
        throw ValueError(fmt::format("{}: variance_scaling over an empty fan (shape {})", path, shape.to_string()));
      double variance = a_ / n;
      switch (distribution_) {
        case Distribution::kTruncatedNormal: return truncated(std::sqrt(variance) / kTruncatedStd, -2.0, 2.0);
        case Distribution::kNormal: return normal(std::sqrt(variance));
        case Distribution::kUniform: return uniform(-1, 1, std::sqrt(3 * variance));
      }
      break;
    }
    default: break;
  }
  throw ValueError(fmt::format("{}: {} has no sampler", path, to_string()));
}

}  // namespace tessel
