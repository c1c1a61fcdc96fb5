// MaxText's deepseek decoder layers (models/deepseek.py): multi-head latent attention, then a dense
// MLP (the first first_num_dense_layers layers) or routed + shared experts (DeepSeekMoeBlock_0).
#include "tessel/models/detail/maxtext_layers.h"

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

}  // namespace tessel::maxtext
