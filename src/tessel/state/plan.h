// A memory plan from an abstract state (or a concrete one: only shapes and shardings are read):
// bytes per device for parameters, gradients and optimizer state, the largest replicated
// parameters, and MaxText's sufficiently-sharded check. Planning works per distinct
// (shape, sharding) pair and per distinct block, never per element, so a 405B-parameter model on
// an 8192-device abstract mesh plans in milliseconds.
//
//   tessel::MemoryPlan p = tessel::plan(tessel::eval_shape(model, mesh, rules),
//                                       {.optimizer = tessel::Optimizer::kAdamW});
//   std::cout << p.to_string();     // or p.to_json()
//   p.total.max                     // the bytes the fullest device needs
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/state/state.h"

namespace tessel {

enum class Optimizer { kNone, kSgdMomentum, kAdamW };
std::string_view name(Optimizer optimizer);       // "none", "sgd", "adamw"
Optimizer parse_optimizer(std::string_view text);  // also "sgd_momentum"; throws ValueError

struct PlanOptions {
  // Optimizer state: SGD momentum keeps one moment per parameter, AdamW two (mu, nu), each in
  // the parameter's dtype and sharding (optax's defaults). Scalars such as the step count are
  // not counted. An optimizer implies gradients.
  Optimizer optimizer = Optimizer::kNone;
  bool gradients = false;  // one gradient per parameter, its dtype and sharding
  // Mesh axes along which parameters are replicated by design (data parallelism). Every other
  // mesh axis of size > 1 is expected to shard each parameter in the sufficiently-sharded check.
  std::vector<std::string> replica_axes = {"data", "diloco"};
  double tolerance = 0.02;  // MaxText's default
  size_t top = 10;          // how many replicated parameters and offenders to list
};

struct BytesSummary {
  int64_t max = 0;
  int64_t min = 0;
  double mean = 0;
  int64_t max_device = 0;  // the id of the first device (mesh order) holding `max`
};

struct ParamPlan {
  std::string path;
  std::string kind;
  Shape shape;
  DType dtype;
  PartitionSpec spec;
  int64_t bytes = 0;             // the whole parameter
  int64_t max_device_bytes = 0;  // its largest block
  int64_t copies = 1;            // devices per distinct block
  std::vector<std::string> unsharded_axes;  // weight axes it is not sharded on
};

struct MemoryPlan {
  std::string mesh;  // Mesh::to_string()
  int64_t device_count = 0;
  PlanOptions options;
  int64_t param_count = 0;  // elements
  int64_t param_bytes = 0;  // global
  std::vector<ParamPlan> params;  // State order
  std::vector<int64_t> params_by_device;  // parameter bytes per device, in mesh order (device_ids())
  BytesSummary params_per_device, gradients_per_device, optimizer_per_device, total;
  std::vector<size_t> largest_replicated;  // indices into params: held whole by every device, largest first
  // Sufficiently sharded (MaxText's check, counted in bytes on both sides of the ratio).
  std::vector<std::string> weight_axes;  // mesh axes of size > 1 that are not replica axes
  int64_t unsharded_bytes = 0;
  double unsharded_fraction = 0;
  bool sufficiently_sharded = true;
  std::vector<size_t> offenders;  // indices into params, largest first

  std::string to_string() const;  // the table `tessel plan` prints
  std::string to_json() const;
};

// Throws ValueError naming a variable without a sharding.
MemoryPlan plan(const State& state, const PlanOptions& options = {});

}  // namespace tessel
