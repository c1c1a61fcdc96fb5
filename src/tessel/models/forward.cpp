#include "tessel/models/forward.h"

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/models/maxtext.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/array.h"
#include "tessel/state/init.h"

namespace tessel {

Tensor model_forward(const ModelConfig& model, const nn::Params& params, const Tensor& inputs) {
  if (std::holds_alternative<DotReluDotConfig>(model.config)) return dot_relu_dot_forward(params, inputs);
  if (const auto* m = std::get_if<MaxTextConfig>(&model.config)) return maxtext_logits(*m, params, inputs);
  return transformer_logits(std::get<TransformerConfig>(model.config), params, inputs);
}

void check_forward(const ModelConfig& model, const Mesh& mesh) {
  const auto* m = std::get_if<MaxTextConfig>(&model.config);
  if (!m) return;
  if (!maxtext_has_forward(*m))
    throw ValueError(fmt::format("{}: decoder_block '{}' has no forward pass in tessel yet (llama2, qwen3, mixtral, qwen3_moe, deepseek and gpt_oss have one)",
                                 model.source, m->decoder_block));
  m->check_mesh(mesh);
}

NamedSharding batch_sharding(const Mesh& mesh, const LogicalRules& rules, int64_t rank) {
  LogicalAxes names(static_cast<size_t>(rank));
  names[0] = rules.has_rule_for("activation_batch") ? "activation_batch" : "batch";
  return NamedSharding(mesh, rules.logical_to_mesh_axes(names, "the batch"));
}

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 8) out += fmt::format(" and {} more", names.size() - 8);
  return out;
}

// The model's parameters on the mesh, each device holding its block of the given weights.
State place_weights(const Runtime& rt, const State& abstract, const std::map<std::string, HostArray>& weights) {
  std::vector<std::string> missing, unknown;
  for (const auto& [path, v] : abstract)
    if (!weights.count(path)) missing.push_back(path);
  for (const auto& [path, w] : weights)
    if (!abstract.contains(path)) unknown.push_back(path);
  if (!missing.empty()) throw ValueError("forward: no weights for " + join(missing));
  if (!unknown.empty()) throw ValueError("forward: the model has no parameter " + join(unknown));
  State placed;
  for (const auto& [path, v] : abstract) {
    const HostArray& w = weights.at(path);
    if (w.shape() != v.shape() || w.dtype() != v.dtype())
      throw ValueError(fmt::format("forward: '{}' is {}; the model's is {}", path, w.type_string(),
                                   type_string(v.dtype(), v.shape())));
    placed.insert(path, Variable(v.kind(), device_put(rt, w, *v.sharding(), path), v.partitioning()));
  }
  return placed;
}

void check_inputs(const ModelConfig& model, const HostArray& inputs) {
  if (const auto* d = std::get_if<DotReluDotConfig>(&model.config)) {
    if (inputs.shape().rank() != 2 || inputs.shape()[1] != d->depth || inputs.dtype() != d->dtype)
      throw ValueError(fmt::format("forward: DotReluDot takes {}[batch, {}], not {}", name(d->dtype), d->depth,
                                   inputs.type_string()));
    return;
  }
  if (inputs.shape().rank() != 2 || inputs.dtype() != DType::kI32)
    throw ValueError("forward: a language model takes int32 tokens [batch, seq], not " + inputs.type_string());
  if (inputs.shape()[1] < 1) throw ValueError("forward: the sequence is empty");
  const auto tokens = inputs.values<int32_t>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= model.vocab())
      throw ValueError(fmt::format("forward: token {} at [{}, {}] is outside the vocabulary [0, {})", tokens[i],
                                   static_cast<int64_t>(i) / inputs.shape()[1],
                                   static_cast<int64_t>(i) % inputs.shape()[1], model.vocab()));
  }
}

}  // namespace

HostArray forward_on_host(const Runtime& rt, const ModelConfig& model, const Mesh& mesh, const LogicalRules& rules,
                          const std::map<std::string, HostArray>& weights, const HostArray& inputs) {
  check_forward(model, mesh);
  check_inputs(model, inputs);
  const NamedSharding batch = batch_sharding(mesh, rules, static_cast<int64_t>(inputs.shape().rank()));
  batch.check_divisible(inputs.shape(), fmt::format("forward: a batch of {} does not divide", inputs.shape()[0]));
  const State params = place_weights(rt, eval_shape(model.build(), mesh, rules), weights);
  Tensor out = ops::reduce(model_forward(model, nn::tensors(params), Tensor(device_put(rt, inputs, batch, "inputs"))));
  if (model.is_lm() && out.dtype() != DType::kF32) out = ops::cast(out, DType::kF32);
  return to_host(out.array());
}

}  // namespace tessel
