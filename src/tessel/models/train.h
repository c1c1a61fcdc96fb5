// One training step on any mesh: the model's loss on a batch, gradients by reverse-mode autodiff
// (each arriving on its parameter's sharding), and the optimizer update on each device's blocks.
// The train state is one State: the parameters (kind "param") and the optimizer state (kind
// "opt_state"), so it is planned, checkpointed and restored like any other state.
//
//   models::Trainer t(rt, model_config, Mesh::parse("data=2,fsdp=2,tensor=2"), rules, {});
//   State state = t.init(/*seed=*/0);                 // params + opt_state, sharded from birth
//   nn::Batch b = nn::make_batch(rt, data, {.seed = 0, .step = 0}, 16, 128, t.batch_sharding());
//   models::StepMetrics m = t.step(state, b, /*step=*/0);  // state updated in place
//   State after = t.eval_shape_step(t.eval_shape());   // the same, on shapes and shardings only
#pragma once

#include <cstdint>

#include "tessel/nn/dataset.h"
#include "tessel/nn/optimizer.h"
#include "tessel/ops/tensor.h"
#include "tessel/runtime/runtime.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/models/model_config.h"
#include "tessel/state/state.h"

namespace tessel::models {

using nn::Batch;
using nn::ByteDataset;
using nn::DataPosition;
using nn::OptimizerConfig;

// The rules `tessel train` uses when none are given: MaxText-style names on data, fsdp, tensor.
LogicalRules default_rules();

struct StepMetrics {
  double loss = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
};

// What a step produces, concrete or abstract alike.
struct StepOutputs {
  State state;       // params and opt_state after the update
  Tensor loss;       // scalar
  State grads;       // one variable per parameter path (kind "grad"), on the parameter's sharding
  StepMetrics metrics;
};

class Trainer {
 public:
  // Throws ValueError when the batch does not suit the model (a transformer needs seq >= 1,
  // DotReluDot takes [batch, depth]).
  Trainer(const Runtime& rt, ModelConfig model, Mesh mesh, LogicalRules rules, OptimizerConfig optimizer,
          ResolveOptions resolve = {});

  const Module& module() const { return module_; }
  const ModelConfig& model() const { return model_; }
  const Mesh& mesh() const { return mesh_; }
  const LogicalRules& rules() const { return rules_; }
  const OptimizerConfig& optimizer() const { return optimizer_; }
  const ResolveOptions& resolve_options() const { return resolve_; }

  // params + opt_state: abstract (nothing allocated) or initialized from `seed`.
  State eval_shape() const;
  State init(uint64_t seed) const;
  // The batch's sharding: its first dimension over the mesh axes the rules give "activation_batch"
  // (or "batch").
  NamedSharding batch_sharding(int64_t rank = 2) const;
  // The batch for `at` with this model's kind of data (tokens of `data` for the LM, the
  // regression task for DotReluDot).
  Batch batch(const ByteDataset* data, const DataPosition& at, int64_t batch, int64_t seq) const;

  // One step at index `step` (the schedule's and bias correction's count). Updates `state`.
  StepMetrics step(State& state, const Batch& batch, int64_t step) const;
  // The step's outputs, without touching `state`; abstract state and batch give abstract outputs.
  StepOutputs run(const State& state, const Tensor& inputs, const Tensor& targets, int64_t step) const;
  // run() on the abstract state and an abstract batch of [batch, seq] (or [batch, depth]).
  StepOutputs eval_shape_step(const State& abstract_state, int64_t batch, int64_t seq) const;

 private:
  Tensor loss(const State& params_state, const std::map<std::string, Tensor, PathLess>& params, const Tensor& inputs,
              const Tensor& targets) const;
  const Runtime* rt_;
  ModelConfig model_;
  Module module_;
  Mesh mesh_;
  LogicalRules rules_;
  OptimizerConfig optimizer_;
  ResolveOptions resolve_;
};

}  // namespace tessel::models
