// eval_shape and init walk a Module's declarations through one function that resolves each
// parameter's sharding, so the abstract state and the initialized one agree by construction.
// eval_shape needs only a Mesh (it may be larger than any runtime: plan a 8192-device job on a
// laptop) and allocates nothing; init fills each device's block straight into its buffer with
// values that depend only on (seed, path, element), so any mesh gives the same parameters.
//
//   auto mesh = tessel::Mesh::parse("data=2,fsdp=2,tensor=2");
//   tessel::State abstract = tessel::eval_shape(model, mesh, rules);     // 0 bytes
//   tessel::State params = tessel::init(rt, model, /*seed=*/0, mesh, rules);
//   tessel::get_partition_spec(params) == tessel::get_partition_spec(abstract)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/runtime/runtime.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/state/module.h"
#include "tessel/state/state.h"

namespace tessel {

// The one place a variable's placement is decided: logical axes through `rules` (Flax's
// resolution plus `options`), explicit mesh axes as given, neither: replicated. Throws
// ShardingError / ValueError naming `path`.
NamedSharding resolve_sharding(const Partitioning& partitioning, const Shape& shape, const Mesh& mesh,
                               const LogicalRules& rules, const ResolveOptions& options = {},
                               std::string_view path = {});

State eval_shape(const Module& model, const Mesh& mesh, const LogicalRules& rules,
                 const ResolveOptions& options = {});

// Every device of `mesh` must belong to `rt`. Each array is labeled with its path in the
// devices' memory accounts.
State init(const Runtime& rt, const Module& model, uint64_t seed, const Mesh& mesh,
           const LogicalRules& rules, const ResolveOptions& options = {});

// Per path, in State order, the PartitionSpec of each placed variable. Throws ValueError naming
// a variable that has no sharding yet (use get_named_sharding with rules for those).
std::vector<std::pair<std::string, PartitionSpec>> get_partition_spec(const State& state);
// Per path, the sharding each variable's partitioning gives on `mesh` under `rules`: the
// target of a reshard or a restore onto another mesh.
std::vector<std::pair<std::string, NamedSharding>> get_named_sharding(const State& state, const Mesh& mesh,
                                                                     const LogicalRules& rules,
                                                                     const ResolveOptions& options = {});

}  // namespace tessel
