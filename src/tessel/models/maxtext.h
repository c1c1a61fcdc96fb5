// MaxText's model families built from MaxText's own config (maxtext_config.h): the parameter tree
// MaxText's Transformer has (every path, shape, dtype, logical axis and initializer) and its
// forward pass. The TrainState around the parameters and MaxText's checkpoints:
// maxtext_checkpoint.h.
//
//   tessel::MaxTextConfig c = tessel::load_maxtext_config({.model = "qwen3-0.6b.yml", .base = "base.yml"});
//   tessel::Module m = tessel::maxtext_model(c);
//   // token_embedder/embedding (vocab, embed_vocab), decoder/layers/self_attention/query/kernel
//   // (embed, layers, q_heads, kv), ..., decoder/decoder_norm/scale (norm)
//   tessel::State params = tessel::eval_shape(m, c.mesh(16), c.rules);
//   tessel::Tensor logits = tessel::maxtext_logits(c, tessel::nn::tensors(weights), tokens);
//
// Families (decoder_block): llama2 (llama2, llama3, llama3.1), qwen3, deepseek (MLA attention;
// dense_layers then moe_layers with routed and shared experts), gpt_oss (attention sinks and
// biases, routed experts with biases, float32 norms).
#pragma once

#include <string>
#include <vector>

#include "tessel/models/maxtext_config.h"
#include "tessel/nn/params.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/module.h"
#include "tessel/state/state.h"

namespace tessel {

Module maxtext_model(const MaxTextConfig& config);

// Whether tessel has this family's forward pass (every family above has one).
bool maxtext_has_forward(const MaxTextConfig& config);

struct MaxTextOutputs {
  Tensor logits;    // [batch, seq, vocab]
  Tensor aux_loss;  // the mean over MoE layers of their load-balance losses; undefined without
};
// tokens: i32 [batch, seq] -> logits and the auxiliary loss MaxText's train step adds to the
// cross-entropy. Throws ValueError for a family without a forward pass.
MaxTextOutputs maxtext_forward(const MaxTextConfig& config, const nn::Params& params, const Tensor& tokens);
Tensor maxtext_logits(const MaxTextConfig& config, const nn::Params& params, const Tensor& tokens);

}  // namespace tessel
