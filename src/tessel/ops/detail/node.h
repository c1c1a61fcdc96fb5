// Internal: a node of the autodiff graph. Each op that has an input in the graph records one: its
// inputs and how to turn the gradient of its output into gradients of those inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tessel/ops/tensor.h"

namespace tessel::ops::detail {

struct Node {
  std::vector<Tensor> inputs;
  // Gradient of the output -> one gradient per input (undefined where an input needs none).
  std::function<std::vector<Tensor>(const Tensor& grad)> backward;
  // Set instead of backward by ops that can fold a sum into their own pass over an input's
  // gradient (RMSNorm's, say: the residual stream's gradient arrives there from two branches).
  // `pending[i]` is the gradient input i has gathered so far (undefined where none); an op that
  // folds it in returns input i's total and clears pending[i], saving a pass over the sum.
  std::function<std::vector<Tensor>(const Tensor& grad, std::vector<Tensor>& pending)> backward_folding;
  bool leaf = false;  // a tensor the user asked gradients for
  // Set by index(): the output is element `index` of the one input along `dim`. grad() then
  // collects the gradients of all such slices of an input and places them with one index_put_all
  // (a scan's L layers would otherwise each give a zero-filled stacked gradient, added L times).
  struct Slice {
    size_t dim = 0;
    int64_t index = 0;
  };
  std::optional<Slice> slice;
};

}  // namespace tessel::ops::detail
