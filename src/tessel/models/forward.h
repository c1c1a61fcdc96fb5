// A model's forward pass, whatever its family, on tensors or on host arrays: the logits of the
// language models (tessel's transformer, MaxText's dense families) and DotReluDot's output.
//
//   Tensor logits = tessel::model_forward(model, nn::tensors(params_state), tokens);  // [batch, seq, vocab]
//
//   // Weights from anywhere (a converted Hugging Face checkpoint), placed on a mesh and run:
//   HostArray out = tessel::forward_on_host(rt, model, Mesh::parse("data=2,tensor=4"), rules, weights, tokens);
#pragma once

#include <map>
#include <string>

#include "tessel/core/host_array.h"
#include "tessel/models/model_config.h"
#include "tessel/nn/params.h"
#include "tessel/ops/tensor.h"
#include "tessel/runtime/runtime.h"
#include "tessel/sharding/logical_rules.h"

namespace tessel {

// Logits [batch, seq, vocab] from i32 tokens [batch, seq] for the language models; DotReluDot's
// output [batch, depth] from its input. Throws ValueError for a MaxText family without a forward
// pass yet.
Tensor model_forward(const ModelConfig& model, const nn::Params& params, const Tensor& inputs);

// Throws ValueError when tessel has no forward pass for the model (MaxText's MoE and MLA families)
// or the mesh does not suit it (MaxText's kv-head sharding check).
void check_forward(const ModelConfig& model, const Mesh& mesh);

// A batch's sharding on `mesh`: its first dimension over the mesh axes the rules give
// "activation_batch" (or "batch"), the others whole.
NamedSharding batch_sharding(const Mesh& mesh, const LogicalRules& rules, int64_t rank = 2);

// The forward pass of `model` with `weights` (every parameter by path, e.g. "decoder/layers/mlp/
// wo/kernel", with the model's shapes and dtypes) on `mesh` under `rules`: each device gets its
// block of every parameter and of `inputs` (sharded as batch_sharding), and the output comes back
// whole (f32 logits for the LMs). Throws ValueError naming missing, unknown or mis-shaped weights,
// inputs of the wrong dtype or rank, tokens outside the vocabulary, and a batch the batch axes do
// not divide.
HostArray forward_on_host(const Runtime& rt, const ModelConfig& model, const Mesh& mesh, const LogicalRules& rules,
                          const std::map<std::string, HostArray>& weights, const HostArray& inputs);

}  // namespace tessel
