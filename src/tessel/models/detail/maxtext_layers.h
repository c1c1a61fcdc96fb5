// Internal (not installed): the parameter declarations of MaxText's layers (layers/linears.py,
// normalizations.py, attentions.py, attention_mla.py, moe.py), each a Module with MaxText's names,
// shapes, logical axes, initializers and fans. The family files (llama2.cpp, qwen3.cpp,
// deepseek.cpp, gpt_oss.cpp) compose them into one decoder layer; maxtext.cpp stacks the layers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/models/maxtext_config.h"
#include "tessel/ops/tensor.h"
#include "tessel/state/module.h"

namespace tessel::maxtext {

// The config's dense kernel initializer: nd_dense_init(dense_init_scale, fan_in, truncated_normal),
// optionally divided by `divisor` (the query kernel's depth scaling).
Initializer kernel_init(const MaxTextConfig& c, double divisor = 1.0);

// DenseGeneral: `kernel` of in_shape + out_shape with `axes`, and a zero `bias` over the output
// dimensions (the kernel's last axes) when `bias` is set.
Module dense(std::string name, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
             LogicalAxes axes, Initializer init, DType dtype, bool bias = false);

// RMSNorm: `scale` of [features] on ("norm",), ones.
Module rms_norm(std::string name, int64_t features, DType dtype);

// Attention (attentions.py): query, key, value, out; their biases when `bias` (the families that
// pass attention_bias); `sinks` with attention_sink; query_norm and key_norm when `qk_norm`.
// `query_scaled`: MaxText divides the query kernel's init by sqrt(head_dim) unless qk-norm or a
// query_pre_attn_scalar replaces it.
Module attention(std::string name, const MaxTextConfig& c, bool qk_norm, bool query_scaled, bool bias = false);

// Multi-head latent attention (attention_mla.py): wq_a, q_norm, wq_b (or query without a q LoRA),
// wkv_a, kv_norm, wkv_b, out.
Module mla(std::string name, const MaxTextConfig& c);

// MlpBlock (linears.py): wi (one activation) or wi_0, wi_1, ... and wo.
Module mlp_block(std::string name, const MaxTextConfig& c, int64_t intermediate, bool bias = false);

// RoutedMoE (moe.py): gate (kernel over `gate_axes`, bias with routed_bias), the experts' wi_0,
// wi_1, wo, and their biases with mlp_bias.
Module routed_moe(std::string name, const MaxTextConfig& c, LogicalAxes gate_axes, int64_t intermediate);

// RoutedAndSharedMoE: MoeBlock_0 (routed) and shared_experts (an MlpBlock of
// shared_experts * moe_mlp_dim).
Module routed_and_shared_moe(std::string name, const MaxTextConfig& c);

// One decoder layer of each family (its files: llama2.cpp, qwen3.cpp, deepseek.cpp, gpt_oss.cpp).
Module llama2_layer(std::string name, const MaxTextConfig& c);
Module qwen3_layer(std::string name, const MaxTextConfig& c);
Module deepseek_dense_layer(std::string name, const MaxTextConfig& c);
Module deepseek_moe_layer(std::string name, const MaxTextConfig& c);
Module gpt_oss_layer(std::string name, const MaxTextConfig& c);
Module mixtral_layer(std::string name, const MaxTextConfig& c);
Module qwen3_moe_layer(std::string name, const MaxTextConfig& c);
// gpt-oss's scanned unit: inhomogeneous_layer_cycle_interval layers, layers_0, layers_1, ...
Module gpt_oss_block(std::string name, const MaxTextConfig& c);

// `layer` repeated `n` times as one Module of stacked parameters (nn.scan over the layers: each
// parameter gains a dimension of size n at param_scan_axis, logically named as the stack
// ("layers", "dense_layers", "moe_layers": MaxText's scan metadata name), a batch axis for the
// fans).
Module stacked(std::string name, const Module& layer, int64_t n, int64_t axis);
Module stacked(std::string name, const Module& layer, int64_t n, int64_t axis, const std::string& logical);

}  // namespace tessel::maxtext

// Forward passes of the layers above, on one layer's weights.
namespace tessel::maxtext {

// One layer's parameter by its path inside the layer ("self_attention/query/kernel"): the
// layer's own, or its slice of a stacked parameter.
using Weights = std::function<Tensor(const std::string& path)>;
// The weights of `name` inside `w` (a submodule).
Weights sub(const Weights& w, const std::string& name);

Tensor rms_norm_forward(const MaxTextConfig& c, const Weights& norm, const Tensor& x);
// Rotary positions on [batch, seq, heads, head_dim] as MaxText gives this config: halves paired
// (RotaryEmbedding), or for llama3.1 neighbours paired with Llama 3.1's scaling (LLaMARotaryEmbedding).
Tensor rope_forward(const MaxTextConfig& c, const Tensor& x);
// x: [batch, seq, emb]. Causal self-attention with rotary positions (rope_max_timescale),
// grouped-query when num_kv_heads < num_query_heads; `qk_norm` applies query_norm/key_norm,
// `query_scale` multiplies the rotated queries (qwen3's head_dim^-0.5; llama2 folds it into init).
// With attention_bias the projections add their biases; with attention_sink the softmax has
// each head's sink; `window` > 0 makes it sliding (gpt-oss's LOCAL_SLIDING layers). With the
// default rope, q and k are rotated (and the queries scaled) inside the attention op, with the bits
// of rope_forward and a scale.
Tensor attention_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, bool qk_norm, double query_scale,
                         int64_t window = 0);
// Multi-head latent attention (attention_mla.py): low-rank queries (wq_a, q_norm, wq_b; or query)
// and keys/values (wkv_a split into the latent, normed by kv_norm and expanded by wkv_b, and one
// rotary key shared by all heads), rope on the qk_rope_head_dim part only, the softmax scale (with
// YaRN's mscale^2 for an extended context) in the query, causal attention, out.
Tensor mla_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x);
// MlpBlock: the product of activation_i(x @ wi_i), @ wo. Activations: silu, gelu, relu, linear.
Tensor mlp_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x);

// RoutedMoE (moe.py): router logits (score function, gate bias), top-k choices with MaxText's
// weights (softmax over the chosen logits and norm_topk_prob; DeepSeek's scaling), dispatch into
// per-expert buffers (capacity_factor, or dropless), an all_to_all to the devices holding the
// experts, the experts' gated MLP (with biases under mlp_bias), the all_to_all back and the
// weighted combine. Its load-balance loss is appended to `aux` when load_balance_loss_weight > 0.
Tensor routed_moe_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux);

// One decoder layer's forward pass; MoE layers append their auxiliary losses to `aux`.
Tensor llama2_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x);
Tensor qwen3_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x);
Tensor mixtral_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux);
Tensor qwen3_moe_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux);
// gpt-oss: attention with biases and sinks, sliding on even layers (`layer` counts in the
// model), then routed experts with biases and the clipped GLU.
Tensor gpt_oss_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, int64_t layer,
                             std::vector<Tensor>& aux);
// deepseek: MLA, then the MLP (dense layers) or routed + shared experts (MoE layers).
Tensor deepseek_layer_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, bool moe,
                              std::vector<Tensor>& aux);

}  // namespace tessel::maxtext
