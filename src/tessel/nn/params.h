// A State's variables as Tensors, the form forward passes take their parameters in.
//
//   nn::Params p = nn::tensors(state);               // path -> Tensor
//   Tensor w = nn::param(p, "decoder/logits_dense/kernel");
#pragma once

#include <map>
#include <string>

#include "tessel/ops/tensor.h"
#include "tessel/state/state.h"

namespace tessel::nn {

using Params = std::map<std::string, Tensor, PathLess>;

// Every variable of `state` as a Tensor (abstract variables as abstract tensors). Throws
// ValueError naming a variable that has no sharding.
Params tensors(const State& state);

// The parameter at `path`; throws ValueError naming it when the state has none (another model's
// state, or a config that does not match the checkpoint).
const Tensor& param(const Params& params, const std::string& path);

}  // namespace tessel::nn
