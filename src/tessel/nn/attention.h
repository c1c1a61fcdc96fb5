// Causal dot-product attention over rotated queries and keys, grouped-query when there are fewer
// key/value heads than query heads; shared by the models' attention layers.
//
//   Tensor context = nn::causal_attention(q, k, v);   // q [b, s, h, d], k [b, s, kv, d], v [b, s, kv, dv]
//   // -> [b, s, h * dv], ready for the output projection
#pragma once

#include "tessel/ops/tensor.h"

namespace tessel::nn {

// softmax(mask(q k^T)) v per head; query head i uses key/value head i / (h / kv). The queries
// arrive already scaled. Throws ValueError when kv does not divide h or the shapes disagree.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace tessel::nn
