// Mixture-of-experts routing on Tensors: top-k choices, and the dispatch of tokens into per-expert
// buffers and their weighted combine back, as MaxText's RoutedMoE computes them.
//
//   ops::TopK top = ops::top_k(router_logits, 2);                  // [b, s, k] values and i32 indices
//   ops::Routing r = ops::route(top.indices, num_experts, -1);     // dropless
//   Tensor buf = ops::moe_dispatch(x, r);                          // [experts, b, capacity, emb]
//   buf = ops::all_to_all(buf, {"expert"}, 0, 1);                  // batch-split -> expert-split
//   ... ops::matmul(buf over experts, wi[experts, emb, mlp]) ...
//   Tensor y = ops::moe_combine(out, weights, r);                  // [b, s, emb]
//
// Each batch row fills its own slots: an expert's buffer for row b holds, in token order (then
// choice order), the tokens of row b routed to it, so the buffers split over the batch exactly as
// the tokens do and the result does not depend on the mesh. With a capacity, choices past it are
// dropped (MaxText's capacity_factor); dropless, the capacity is the fullest buffer over the
// whole batch (an all-reduce of one number), so nothing is dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/ops/tensor.h"

namespace tessel::ops {

// The k largest entries along the last dimension, largest first, ties to the lower index (as
// jax.lax.top_k): the values (differentiable) and their indices (i32). A split last dimension is
// gathered first.
struct TopK {
  Tensor values;
  Tensor indices;
};
TopK top_k(const Tensor& x, int64_t k);

// x[..., indices[..., j]] along the last dimension (jnp.take_along_axis): [..., k], with the
// gradient added back at the indices.
Tensor take_along_last(const Tensor& x, const Tensor& indices);

// How many of indices[..., :] name each class: [..., n] (like's shape, dtype and leading split),
// no gradient. With indices from top_k, the one-hot of the choices summed over them.
Tensor choice_counts(const Tensor& indices, const Tensor& like);

// Where each choice of each token goes: indices [batch, seq, k] (i32) of experts in
// [0, num_experts), and the row (slot) of that expert's buffer for the token's batch row, -1
// where the choice is dropped. Both split over the batch as the indices were, seq and k whole.
struct Routing {
  Tensor indices;
  Tensor slots;
  int64_t num_experts = 0;
  int64_t capacity = 0;  // rows per expert and batch row
};
// `capacity` > 0: at most that many tokens per expert and batch row, later tokens dropped (in the
// order of the row's tokens, then choices: MaxText's cumsum). <= 0: dropless. Throws ValueError
// on an index out of range.
Routing route(const Tensor& indices, int64_t num_experts, int64_t capacity);

// x [batch, seq, emb] -> [num_experts, batch, capacity, emb]: each kept choice's token in its
// slot, zeros elsewhere. The batch stays split as in the routing, emb as in x.
Tensor moe_dispatch(const Tensor& x, const Routing& routing);
// buffer [num_experts, batch, capacity, emb] -> [batch, seq, emb]: for each token, the sum over
// its kept choices j of weights[b, s, j] * buffer[expert, b, slot]. Differentiable in both.
Tensor moe_combine(const Tensor& buffer, const Tensor& weights, const Routing& routing);

// The buffer [experts, ...] split over its experts as `kernel` ([experts, ...], an expert
// kernel) splits them: where the batch is split over those axes (expert parallelism) an
// all_to_all moves each device's tokens to the devices holding their experts; otherwise each
// device keeps the slice of its experts (no bytes move).
Tensor to_experts(const Tensor& buffer, const Tensor& kernel);
// The expert outputs [experts, batch, capacity, emb] back to the tokens' devices: the all_to_all
// back where to_experts made one (moe_combine moves anything else).
Tensor from_experts(const Tensor& buffer, const Routing& routing);

// `axes` move from dimension `concat_dim` (where they are the minor axes of its split) to
// `split_dim` (appended as its minor axes): jax.lax.all_to_all(tiled=True) on each device group,
// the exchange of expert parallelism. Its gradient is the all_to_all back.
Tensor all_to_all(const Tensor& x, const std::vector<std::string>& axes, size_t split_dim, size_t concat_dim);

}  // namespace tessel::ops
