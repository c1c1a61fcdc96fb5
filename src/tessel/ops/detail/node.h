// Internal: a node of the autodiff graph. Each op that has an input in the graph records one: its
// inputs and how to turn the gradient of its output into gradients of those inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tessel/ops/tensor.h"

namespace tessel::ops::detail {

struct Node {
  std::vector<Tensor> inputs;
  // Gradient of the output -> one gradient per input (undefined where an input needs none).
  std::function<std::vector<Tensor>(const Tensor& grad)> backward;
  bool leaf = false;  // a tensor the user asked gradients for
};

}  // namespace tessel::ops::detail
