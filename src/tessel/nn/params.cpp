#include "tessel/nn/params.h"

#include "tessel/core/error.h"

namespace tessel::nn {

Params tensors(const State& state) {
  Params out;
  for (const auto& [path, v] : state) {
    if (!v.sharding()) throw ValueError("'" + path + "' has no sharding yet (eval_shape or init with a mesh first)");
    out.emplace(path, v.is_abstract() ? Tensor::abstract(v.shape(), v.dtype(), *v.sharding()) : Tensor(v.array(path)));
  }
  return out;
}

const Tensor& param(const Params& params, const std::string& path) {
  auto it = params.find(path);
  if (it == params.end())
    throw ValueError("the model's parameters have no '" + path + "' (a different model's state?)");
  return it->second;
}

}  // namespace tessel::nn
