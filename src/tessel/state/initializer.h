// Parameter initializers with JAX's definitions (jax.nn.initializers), sampled from counter-based
// random numbers: the value of element i of a parameter depends only on (seed, path, i), so any
// device fills just its own block and the result is bit-identical on every mesh.
//
//   auto init = tessel::Initializer::variance_scaling(1.0, tessel::FanMode::kFanIn,
//                                                     tessel::Distribution::kTruncatedNormal);
//   init.fill(/*seed=*/0, "mlp/wi/kernel", shape, DType::kF32, fans, my_box, out_bytes);
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"

namespace tessel {
namespace detail {
struct SampleSpec;
}

enum class FanMode { kFanIn, kFanOut, kFanAvg };
enum class Distribution { kTruncatedNormal, kNormal, kUniform };

// Which dimensions feed into (in) and out of a unit, as JAX's in_axis / out_axis / batch_axis.
// Dimensions in none of them form the receptive field (a convolution's window).
struct Fans {
  std::vector<size_t> in_axes;
  std::vector<size_t> out_axes;
  std::vector<size_t> batch_axes;  // e.g. a stacked `layers` dimension
};

// fan_in and fan_out of `shape` as JAX's _compute_fans. Throws ValueError for an axis out of
// range or used twice. Default fans (no in or out axes declared): in = dim -2, out = dim -1 among
// the dimensions that are not batch axes.
std::pair<double, double> compute_fans(const Shape& shape, const Fans& fans);

class Initializer {
 public:
  enum class Kind { kZeros, kOnes, kConstant, kNormal, kTruncatedNormal, kUniform, kVarianceScaling };

  static Initializer zeros();
  static Initializer ones();
  static Initializer constant(double value);
  static Initializer normal(double stddev = 1e-2);                 // N(0, stddev^2)
  static Initializer truncated_normal(double stddev = 1e-2, double lower = -2.0, double upper = 2.0);
  static Initializer uniform(double scale = 1e-2);                 // U[0, scale)
  // variance = scale / fan; truncated normal is rescaled to that variance (JAX's .8796...).
  static Initializer variance_scaling(double scale, FanMode mode, Distribution distribution);
  static Initializer lecun_normal() { return variance_scaling(1, FanMode::kFanIn, Distribution::kTruncatedNormal); }
  static Initializer lecun_uniform() { return variance_scaling(1, FanMode::kFanIn, Distribution::kUniform); }
  static Initializer he_normal() { return variance_scaling(2, FanMode::kFanIn, Distribution::kTruncatedNormal); }
  static Initializer he_uniform() { return variance_scaling(2, FanMode::kFanIn, Distribution::kUniform); }
  static Initializer glorot_normal() { return variance_scaling(1, FanMode::kFanAvg, Distribution::kTruncatedNormal); }
  static Initializer glorot_uniform() { return variance_scaling(1, FanMode::kFanAvg, Distribution::kUniform); }
  // By name: "zeros", "ones", "normal", "truncated_normal", "uniform", "lecun_normal", ... (the
  // JAX names). Throws ValueError naming the known ones.
  static Initializer by_name(std::string_view name);
  // A name as by_name(), or a call with arguments as to_string() prints them: "normal(1.0)",
  // "truncated_normal(0.02)", "uniform(0.1)", "constant(0.5)",
  // "variance_scaling(2.0, fan_in, truncated_normal)". Throws ValueError naming the text.
  static Initializer parse(std::string_view text);

  Kind kind() const { return kind_; }
  std::string to_string() const;  // "variance_scaling(scale=2, mode=fan_in, distribution=truncated_normal)"

  // Writes the elements of `box` of a parameter of `shape` into `out` (row-major, `dtype`).
  // Float dtypes only, except zeros/ones/constant which fill any dtype. Throws ValueError.
  // Samples are computed in f32 (JAX's default) and rounded to bf16/f16 or widened to f64.
  void fill(uint64_t seed, std::string_view path, const Shape& shape, DType dtype,
            const Fans& fans, const Box& box, std::span<std::byte> out) const;

 private:
  detail::SampleSpec sample_spec(const Shape& shape, const Fans& fans, std::string_view path) const;
  Initializer(Kind kind, double a, double b = 0, double c = 0) : kind_(kind), a_(a), b_(b), c_(c) {}
  Kind kind_;
  double a_, b_, c_;  // kind-specific: value / stddev / scale, lower, upper
  FanMode mode_ = FanMode::kFanIn;
  Distribution distribution_ = Distribution::kTruncatedNormal;
};

}  // namespace tessel
