// MaxText's gpt-oss decoder layer (models/gpt_oss.py): attention with biases and sinks, routed
// experts with biases; its norms keep float32 weights whatever weight_dtype is. Scanned, the
// layers come in blocks of inhomogeneous_layer_cycle_interval (alternating attention kinds).
#include <cmath>

#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {

Module gpt_oss_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, DType::kF32));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, DType::kF32));
  // query_pre_attn_scalar (head_dim^-0.5) replaces the query init's depth scaling.
  m.add(attention("GptOssAttention", c, /*qk_norm=*/false, /*query_scaled=*/false, c.attention_bias));
  m.add(routed_moe("GptOssMlp", c, {std::string("embed"), std::nullopt}, c.mlp_dim));
  return m;
}

Module gpt_oss_block(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  for (int64_t i = 0; i < c.inhomogeneous_layer_cycle_interval; ++i)
    m.add(gpt_oss_layer("layers_" + std::to_string(i), c));
  return m;
}

Tensor gpt_oss_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t layer,
                             std::vector<Tensor>& aux) {
  // gpt_oss.py's ATTENTION_PATTERN: (LOCAL_SLIDING, GLOBAL) by layer index.
  const int64_t window = layer % 2 == 0 ? c.sliding_window_size : 0;
  const double query_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));  // query_pre_attn_scalar
  const Tensor attended =
      attention_forward(c, sub(w, "GptOssAttention"), rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x),
                        /*qk_norm=*/false, query_scale, window);
  const Tensor y = ops::add(x, attended);
  return ops::add(y, routed_moe_forward(c, sub(w, "GptOssMlp"),
                                        rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y), aux));
}

}  // namespace tessel::maxtext
