// Causal dot-product attention over rotated queries and keys, grouped-query when there are fewer
// key/value heads than query heads; shared by the models' attention layers.
//
//   Tensor context = nn::causal_attention(q, k, v);   // q [b, s, h, d], k [b, s, kv, d], v [b, s, kv, dv]
//   // -> [b, s, h * dv], ready for the output projection
#pragma once

#include <optional>

#include "tessel/ops/attention.h"
#include "tessel/ops/tensor.h"

namespace tessel::nn {

struct AttentionOptions {
  // Learned per-head logits [h] joining each softmax as one more column that attends to nothing
  // (gpt-oss's sinks, MaxText's attention_sink); undefined: none.
  Tensor sinks;
  // > 0: each query sees only the last `window` positions (itself included): sliding attention.
  int64_t window = 0;
  // q and k arrive unrotated, and are rotated (queries scaled) as ops::AttentionRope says: inside the
  // fused op, or by ops::rope before the composite with sinks. Unset: they arrive rotated.
  std::optional<ops::AttentionRope> rope;
};

// softmax(mask(q k^T)) v per head; query head i uses key/value head i / (h / kv). The queries
// arrive already scaled, unless options.rope rotates and scales them. Without sinks this is the
// fused ops::causal_attention (ops/attention.h); with sinks, a composite of the ops. Throws
// ValueError when kv does not divide h or the shapes disagree.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

}  // namespace tessel::nn
