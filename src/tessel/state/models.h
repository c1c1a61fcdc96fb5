// The parameter declarations of the built-in model families, with MaxText's logical axis names so
// MaxText's rules (base.yml) apply unchanged. The forward passes live in the nn layer; these
// functions only declare what exists, its shape and how it is sharded and initialized.
//
//   tessel::TransformerConfig c{.vocab = 256, .embed = 256, .layers = 4, .heads = 4, .mlp = 1024};
//   tessel::Module m = tessel::transformer_lm(c);
//   // token_embedder/embedding (vocab, embed), decoder/layers/self_attention/query/kernel
//   // (embed, layers, q_heads, kv), ..., decoder/decoder_norm/scale (norm)
#pragma once

#include <cstdint>
#include <string>

#include "tessel/core/dtype.h"
#include "tessel/state/initializer.h"
#include "tessel/state/module.h"

namespace tessel {

// The Flax NNX GSPMD guide's model: x @ dot1 -> relu -> @ w2.
struct DotReluDotConfig {
  int64_t depth = 1024;   // input and output width (logical "embed")
  int64_t hidden = 0;     // 0: depth (logical "mlp")
  DType dtype = DType::kF32;
  Initializer kernel_init = Initializer::lecun_normal();
};

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

// Both throw ValueError naming the field for a non-positive size, heads not dividing embed (when
// head_dim is not given), kv_heads not dividing heads, a scan axis out of range, or more than
// 10000 unstacked layers.
void validate(const DotReluDotConfig& config);
void validate(const TransformerConfig& config);

Module dot_relu_dot(const DotReluDotConfig& config);
Module transformer_lm(const TransformerConfig& config);

}  // namespace tessel
