// MaxText's qwen3 decoder layer (models/qwen3.py, Qwen3DecoderLayer): llama2's layout with RMSNorm
// on queries and keys per head (use_qk_norm) and the queries scaled by head_dim^-0.5.
#include <cmath>

#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {

Module qwen3_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  // query_pre_attn_scalar replaces the query init's depth scaling.
  m.add(attention("self_attention", c, c.use_qk_norm, /*query_scaled=*/false));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(mlp_block("mlp", c, c.mlp_dim));
  return m;
}

Tensor qwen3_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x) {
  const double query_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Tensor attended = attention_forward(c, sub(w, "self_attention"),
                                            rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x),
                                            c.use_qk_norm, query_scale);
  const Tensor y = ops::add(x, attended);
  return ops::add(y, mlp_forward(c, sub(w, "mlp"), rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y)));
}

}  // namespace tessel::maxtext
