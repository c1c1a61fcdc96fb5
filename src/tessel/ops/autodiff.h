// Reverse-mode autodiff over the SPMD ops: mark the tensors to differentiate with requires_grad,
// compute, then grad() walks the graph back from a scalar. Each gradient arrives on its tensor's
// sharding: a partial sum is reduce-scattered where that sharding splits the dimension (FSDP
// gradients) and all-reduced over the rest (data-parallel gradients).
//
//   Tensor w = ops::requires_grad(Tensor(params.at("w").array()));
//   Tensor loss = ops::mean(ops::square(ops::sub(ops::dot(x, w), y)));
//   std::vector<Tensor> g = ops::grad(loss, {w});   // g[0].sharding() == w.sharding()
#pragma once

#include <vector>

#include "tessel/ops/tensor.h"

namespace tessel::ops {

// x as a leaf of the graph: grad() can differentiate with respect to it.
Tensor requires_grad(const Tensor& x);

// d loss / d x for each x in `wrt` (each a requires_grad leaf or a tensor computed from one).
// `loss` must be a scalar. A tensor the loss does not depend on gets zeros.
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt);

namespace detail {
// False while grad() runs the backward functions, so they record no graph of their own.
bool recording();
}  // namespace detail

}  // namespace tessel::ops
