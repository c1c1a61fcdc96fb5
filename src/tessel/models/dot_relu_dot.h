// The Flax NNX GSPMD guide's model, x @ dot1 -> relu -> @ w2: its parameters (logical axes
// embed and mlp, so MaxText's rules apply) and its forward pass, in one place.
//
//   tessel::Module m = tessel::dot_relu_dot({.depth = 1024});   // dot1/kernel, w2
//   Tensor y = tessel::dot_relu_dot_forward(nn::tensors(state), x);
#pragma once

#include <cstdint>

#include "tessel/core/dtype.h"
#include "tessel/nn/params.h"
#include "tessel/state/initializer.h"
#include "tessel/state/module.h"

namespace tessel {

struct DotReluDotConfig {
  int64_t depth = 1024;   // input and output width (logical "embed")
  int64_t hidden = 0;     // 0: depth (logical "mlp")
  DType dtype = DType::kF32;
  Initializer kernel_init = Initializer::lecun_normal();
};

// Throws ValueError naming the field for a non-positive size.
void validate(const DotReluDotConfig& config);

Module dot_relu_dot(const DotReluDotConfig& config);

// relu(x @ dot1) @ w2; x: [batch, depth].
Tensor dot_relu_dot_forward(const nn::Params& params, const Tensor& x);

}  // namespace tessel
