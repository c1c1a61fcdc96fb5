// Forward passes of the built-in models (their parameters are declared in state/models.h), as
// SPMD ops on Tensors: the same code runs on any mesh, on concrete or abstract parameters, and
// records gradients.
//
//   nn::Params p = nn::tensors(state);                       // path -> Tensor
//   Tensor logits = nn::transformer_logits(config, p, tokens);  // [batch, seq, vocab]
//   Tensor loss = ops::cross_entropy(logits, targets);
#pragma once

#include <map>
#include <string>

#include "tessel/ops/tensor.h"
#include "tessel/state/models.h"
#include "tessel/state/state.h"

namespace tessel::nn {

using Params = std::map<std::string, Tensor, PathLess>;

// Every variable of `state` as a Tensor (abstract variables as abstract tensors). Throws
// ValueError naming a variable that has no sharding.
Params tensors(const State& state);

// x * rsqrt(mean(x^2 over the last dimension) + eps) * scale (MaxText's RMSNorm, eps 1e-5).
Tensor rms_norm(const Tensor& x, const Tensor& scale, double eps = 1e-5);

// DotReluDot: relu(x @ dot1) @ w2.
Tensor dot_relu_dot(const Params& params, const Tensor& x);

// The decoder-only LM: token embedding, per layer pre-norm causal self-attention with rotary
// positions (grouped-query when kv_heads < heads) and a pre-norm MLP (gelu, or silu-gated), each
// added to the residual stream; a final norm and the logits (logits_dense or the tied
// embedding). tokens: i32 [batch, seq] -> logits [batch, seq, vocab].
Tensor transformer_logits(const TransformerConfig& config, const Params& params, const Tensor& tokens);

}  // namespace tessel::nn
