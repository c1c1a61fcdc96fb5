// Causal dot-product attention as one op, forward and backward: softmax(mask(q k^T)) v for every
// query head, grouped-query when there are fewer key/value heads, optionally sliding.
//
//   Tensor o = ops::causal_attention(q, k, v);   // q [b, s, h, d], k [b, s, kv, d], v [b, s, kv, dv]
//   // -> o [b, s, h, dv]
//
// Each device runs its own (batch, key/value head) blocks, straight from and into the [b, s, heads,
// d] layouts (no transposes), 64 queries at a time against only the keys they can see: the masked
// scores are never computed, and the softmax and the mask run on each block while it is in cache.
// It keeps the probabilities [b, kv, h / kv, s, s] for the backward pass, as the composite does.
// Batch and head splits are kept (heads only where the split divides kv as well); the sequence and
// head dimensions are gathered.
#pragma once

#include <cstdint>

#include "tessel/ops/tensor.h"

namespace tessel::ops {

// Rotary embeddings the op applies itself as it reads q and k: MaxText's default rope (the halves of
// head_dim paired; pair k at position p turned by p / max_timescale^(2k/d)), the queries then times
// query_scale. The result and the gradients are the bits of
//   causal_attention(rope(q, 1, max_timescale, query_scale), rope(k, 1, max_timescale), v)
// without the rotated copies of q and k that the rope ops write and read back, forward and backward.
struct AttentionRope {
  double max_timescale = 10000;
  double query_scale = 1;
};

// The queries arrive scaled. window > 0: each query sees only the last `window` positions (itself
// included). Throws ValueError when kv does not divide h or the shapes disagree.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window = 0);
// The same with q and k rotated inside the op (AttentionRope); throws ValueError too for an odd
// head_dim or a max_timescale that is not positive.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window, const AttentionRope& rope);

// Throws that ValueError unless q [b, s, h, d], k [b, s, kv, d] and v [b, s, kv, dv] fit, kv
// dividing h (one dtype, one mesh).
void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace tessel::ops
