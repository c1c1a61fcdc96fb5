// MaxText's deepseek decoder layers (models/deepseek.py): multi-head latent attention, then a dense
// MLP (the first first_num_dense_layers layers) or routed + shared experts (DeepSeekMoeBlock_0).
#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {
namespace {

Module deepseek_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(mla("self_attention", c));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  return m;
}

}  // namespace

Module deepseek_dense_layer(std::string name, const MaxTextConfig& c) {
  Module m = deepseek_layer(std::move(name), c);
  m.add(mlp_block("mlp", c, c.mlp_dim));
  return m;
}

Module deepseek_moe_layer(std::string name, const MaxTextConfig& c) {
  Module m = deepseek_layer(std::move(name), c);
  m.add(routed_and_shared_moe("DeepSeekMoeBlock_0", c));
  return m;
}

Tensor deepseek_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, bool moe,
                              std::vector<Tensor>& aux) {
  const Tensor attended =
      mla_forward(c, sub(w, "self_attention"), rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x));
  const Tensor y = ops::add(x, attended);
  const Tensor normed = rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y);
  if (!moe) return ops::add(y, mlp_forward(c, sub(w, "mlp"), normed));
  const Weights block = sub(w, "DeepSeekMoeBlock_0");
  const Tensor routed = routed_moe_forward(c, sub(block, "MoeBlock_0"), normed, aux);
  return ops::add(y, ops::add(routed, mlp_forward(c, sub(block, "shared_experts"), normed)));
}

}  // namespace tessel::maxtext
