#include "tessel/nn/attention.h"

#include "tessel/core/error.h"
#include "tessel/ops/attention.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  ops::check_attention_shapes(q, k, v);
  const int64_t b = q.shape()[0], s = q.shape()[1], h = q.shape()[2], dv = v.shape()[3];
  if (!options.sinks.defined()) {
    const Tensor o = options.rope ? ops::causal_attention(q, k, v, options.window, *options.rope)
                                  : ops::causal_attention(q, k, v, options.window);
    return ops::reshape(o, Shape{b, s, h * dv});
  }
  if (options.rope) {
    AttentionOptions rotated = options;
    rotated.rope.reset();
    return causal_attention(ops::rope(q, 1, options.rope->max_timescale, options.rope->query_scale),
                            ops::rope(k, 1, options.rope->max_timescale), v, rotated);
  }
  // With sinks, the composite: its softmax takes the sink column.
  if (options.sinks.shape() != Shape{h})
    throw ValueError("causal_attention: sinks must be [heads = " + std::to_string(h) + "], got " +
                     options.sinks.to_string());
  const int64_t kv = k.shape()[2], g = h / kv;
  // Query heads grouped by the key/value head they share: [b, kv, g * s, d].
  const int64_t d = q.shape()[3];
  const Tensor qg =
      ops::reshape(ops::transpose(ops::reshape(q, Shape{b, s, kv, g, d}), {0, 2, 3, 1, 4}), Shape{b, kv, g * s, d});
  const Tensor kt = ops::transpose(k, {0, 2, 1, 3}), vt = ops::transpose(v, {0, 2, 1, 3});
  const Tensor scores = ops::reshape(ops::matmul(qg, kt, false, true), Shape{b, kv, g, s, s});
  const Tensor masked = ops::causal_mask(scores, options.window);
  // The sink column: one logit per head (head = kv head * g + group), for every query.
  const Tensor column =
      ops::broadcast_like(ops::reshape(options.sinks, Shape{1, kv, g, 1, 1}), ops::slice(masked, 4, 0, 1));
  const Tensor probs = ops::reshape(ops::slice(ops::softmax(ops::concat({masked, column}, 4), 4), 4, 0, s),
                                    Shape{b, kv, g * s, s});
  const Tensor context = ops::matmul(probs, vt);
  return ops::reshape(ops::transpose(ops::reshape(context, Shape{b, kv, g, s, dv}), {0, 3, 1, 2, 4}),
                      Shape{b, s, h * dv});
}

}  // namespace tessel::nn
