// SPMD ops on Tensors. Each op derives its output sharding from its inputs' (sharding
// propagation, as GSPMD and DTensor do), redistributes an operand only when the math needs it, and
// runs on every device's own block. On abstract tensors the same ops derive shapes, dtypes and
// shardings only (eval_shape of any function). Every op records its gradient (autodiff.h).
//
//   Tensor h = ops::relu(ops::dot(x, w1));   // (data, None) @ (None, tensor) -> (data, tensor)
//   Tensor y = ops::dot(h, w2);              // contracted over tensor: partial over tensor
//   Tensor loss = ops::mean(ops::square(ops::sub(y, target)));
//
// Redistribution picks the cheapest of: a local slice (replicated -> sharded), keeping a partial
// sum (the contraction runs on shards and its result is reduced later), or an all-gather.
#pragma once

#include <string>
#include <vector>

#include "tessel/ops/tensor.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel::ops {

// --- sharding
// The value on `target` (any mesh of the runtime). A partial input is reduce-scattered where the
// target shards a dimension over a partial axis and all-reduced over the rest first.
Tensor reshard(const Tensor& x, const NamedSharding& target);
// The user's hint: the value with `spec` on its own mesh.
Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec);
// All-reduces a partial tensor (no-op otherwise).
Tensor reduce(const Tensor& x);

// --- matrix products
// a[..., k] @ b[k, n] -> [..., n].
Tensor dot(const Tensor& a, const Tensor& b);
// g[..., n] @ b[k, n]^T -> [..., k] (the gradient of dot with respect to a).
Tensor dot_nt(const Tensor& g, const Tensor& b);
// a[..., k]^T @ g[..., n], summed over all leading dimensions -> [k, n] (the gradient of dot with
// respect to b).
Tensor dot_tn(const Tensor& a, const Tensor& g);

// --- elementwise (numpy broadcasting)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor scale(const Tensor& x, double factor);
Tensor relu(const Tensor& x);
Tensor square(const Tensor& x);

// --- reductions
Tensor sum(const Tensor& x, size_t dim);  // drops `dim`
Tensor sum(const Tensor& x);              // over all dimensions: a scalar
Tensor mean(const Tensor& x);             // over all dimensions: a scalar

// Sums x over the dimensions that numpy broadcasting of `shape` to x.shape() adds or stretches,
// giving `shape`: the gradient of a broadcast.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace tessel::ops
