// MaxText's mixtral decoder layer (models/mixtral.py): llama2's attention, then routed experts
// (MoeBlock_0) in place of the MLP; and qwen3_moe's (models/qwen3.py, Qwen3MoeDecoderLayer):
// qwen3's attention with routed experts (moe_block).
#include <cmath>

#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {

Module mixtral_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(attention("self_attention", c, /*qk_norm=*/false, /*query_scaled=*/!c.use_qk_norm));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(routed_moe("MoeBlock_0", c, {std::string("embed"), std::nullopt}, c.mlp_dim));
  return m;
}

Module qwen3_moe_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(attention("self_attention", c, c.use_qk_norm, /*query_scaled=*/false));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(routed_moe("moe_block", c, {std::string("embed"), std::nullopt}, c.moe_mlp_dim));
  return m;
}

Tensor mixtral_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux) {
  // As llama2: 1/sqrt(head_dim) is folded into the query kernel.
  const Tensor attended = attention_forward(c, sub(w, "self_attention"),
                                            rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x),
                                            /*qk_norm=*/false, /*query_scale=*/1.0);
  const Tensor y = ops::add(x, attended);
  return ops::add(y, routed_moe_forward(c, sub(w, "MoeBlock_0"),
                                        rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y), aux));
}

Tensor qwen3_moe_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux) {
  const double query_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Tensor attended = attention_forward(c, sub(w, "self_attention"),
                                            rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x),
                                            c.use_qk_norm, query_scale);
  const Tensor y = ops::add(x, attended);
  return ops::add(y, routed_moe_forward(c, sub(w, "moe_block"),
                                        rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y), aux));
}

}  // namespace tessel::maxtext
