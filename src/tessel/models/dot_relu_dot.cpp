#include "tessel/models/dot_relu_dot.h"

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/ops/ops.h"

namespace tessel {

void validate(const DotReluDotConfig& c) {
  if (c.depth <= 0) throw ValueError(fmt::format("dot_relu_dot: depth must be positive, got {}", c.depth));
  if (c.hidden < 0) throw ValueError(fmt::format("dot_relu_dot: hidden must be positive, got {}", c.hidden));
}

Module dot_relu_dot(const DotReluDotConfig& c) {
  validate(c);
  const int64_t hidden = c.hidden ? c.hidden : c.depth;
  Module m("model");
  m.param({.name = "dot1/kernel", .shape = {c.depth, hidden}, .dtype = c.dtype, .init = c.kernel_init,
           .partitioning = Partitioning::by_logical({"embed", "mlp"}), .fans = {{0}, {1}, {}}});
  m.param({.name = "w2", .shape = {hidden, c.depth}, .dtype = c.dtype, .init = c.kernel_init,
           .partitioning = Partitioning::by_logical({"mlp", "embed"}), .fans = {{0}, {1}, {}}});
  return m;
}

Tensor dot_relu_dot_forward(const nn::Params& p, const Tensor& x) {
  return ops::dot(ops::relu(ops::dot(x, nn::param(p, "dot1/kernel"))), nn::param(p, "w2"));
}

}  // namespace tessel
