// MaxText's llama2 decoder layer (models/llama2.py), also llama3/3.1's: pre-norm self-attention and
// a pre-norm gated MLP, each added to the residual stream.
#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {

Module llama2_layer(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(rms_norm("pre_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  // llama2 does not pass use_qk_norm to its Attention, but the query init still reads the config's.
  m.add(attention("self_attention", c, /*qk_norm=*/false, /*query_scaled=*/!c.use_qk_norm));
  m.add(rms_norm("post_self_attention_layer_norm", c.emb_dim, c.weight_dtype));
  m.add(mlp_block("mlp", c, c.mlp_dim));
  return m;
}

Tensor llama2_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x) {
  // The 1/sqrt(head_dim) of the attention logits is folded into the query kernel (its init and
  // MaxText's checkpoint conversion), so the forward pass does not scale the queries.
  const Tensor attended = attention_forward(c, sub(w, "self_attention"),
                                            rms_norm_forward(c, sub(w, "pre_self_attention_layer_norm"), x),
                                            /*qk_norm=*/false, /*query_scale=*/1.0);
  const Tensor y = ops::add(x, attended);
  return ops::add(y, mlp_forward(c, sub(w, "mlp"), rms_norm_forward(c, sub(w, "post_self_attention_layer_norm"), y)));
}

}  // namespace tessel::maxtext
