// tessel's own decoder-only transformer LM: its parameters, with MaxText-style logical axis names
// so MaxText's rules (base.yml) apply unchanged, and its forward pass, in one place. (MaxText's
// own families, built from MaxText's YAML, are in maxtext.h.)
//
//   tessel::TransformerConfig c{.vocab = 256, .embed = 256, .layers = 4, .heads = 4, .mlp = 1024};
//   tessel::Module m = tessel::transformer_lm(c);
//   // token_embedder/embedding (vocab, embed), decoder/layers/self_attention/query/kernel
//   // (embed, layers, q_heads, kv), ..., decoder/decoder_norm/scale (norm)
//   Tensor logits = tessel::transformer_logits(c, nn::tensors(state), tokens);  // [batch, seq, vocab]
#pragma once

#include <cstdint>
#include <string>

#include "tessel/core/dtype.h"
#include "tessel/nn/params.h"
#include "tessel/state/initializer.h"
#include "tessel/state/module.h"

namespace tessel {

// A decoder-only transformer LM with MaxText's parameter names and layouts.
struct TransformerConfig {
  int64_t vocab = 256;
  int64_t embed = 256;
  int64_t layers = 2;
  int64_t heads = 4;      // query heads
  int64_t kv_heads = 0;   // 0: heads; must divide heads (grouped-query attention)
  int64_t head_dim = 0;   // 0: embed / heads, which must then divide evenly
  int64_t mlp = 1024;
  bool scan_layers = true;   // one stacked parameter per kind with a "layers" dimension
  int64_t scan_axis = 1;     // where the layers dimension goes (MaxText's param_scan_axis)
  bool tied_embedding = false;  // logits through the token embedding (no logits_dense)
  bool gated_mlp = false;       // wi_0 and wi_1 (SwiGLU) instead of wi
  bool qk_norm = false;         // RMSNorm scales on queries and keys (query_norm, key_norm)
  DType dtype = DType::kF32;
  Initializer kernel_init = Initializer::lecun_normal();
  Initializer embedding_init = Initializer::normal(1.0);
  Initializer norm_init = Initializer::ones();

  int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : (heads > 0 ? embed / heads : 0); }
};

// Throws ValueError naming the field for a non-positive size, heads not dividing embed (when
// head_dim is not given), kv_heads not dividing heads, a scan axis out of range, or more than
// 10000 unstacked layers.
void validate(const TransformerConfig& config);

Module transformer_lm(const TransformerConfig& config);

// Token embedding, per layer pre-norm causal self-attention with rotary positions (grouped-query
// when kv_heads < heads) and a pre-norm MLP (gelu, or silu-gated), each added to the residual
// stream; a final norm and the logits (logits_dense or the tied embedding).
// tokens: i32 [batch, seq] -> logits [batch, seq, vocab].
Tensor transformer_logits(const TransformerConfig& config, const nn::Params& params, const Tensor& tokens);

}  // namespace tessel
