// The target of a restore onto a mesh that need not be the one an item was saved on, built from
// what the item recorded: its leaves' logical axes, explicit mesh axes or saved specs.
//
//   auto mesh = tessel::Mesh::parse("data=2,tensor=4");
//   tessel::State target = tessel::restore_target("ckpt/7/default", mesh);   // abstract, placed
//   tessel::State state = tessel::restore(rt, "ckpt/7/default", target);
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/state/state.h"

namespace tessel {

struct TargetOptions {
  std::optional<LogicalRules> rules;  // for leaves saved with logical axes; default: the item's own
  std::vector<std::string> paths;     // only these leaves (an absent one is an error); all when empty
  ResolveOptions resolve;
};

// One abstract variable per leaf with its sharding on `mesh`: its logical axes through the rules,
// else its explicit mesh axes, else its saved spec applied to `mesh`, else replicated. Throws
// ValueError naming a leaf whose saved spec does not fit `mesh` (an axis it lacks), or a wanted
// path the item does not hold.
State restore_target(const std::filesystem::path& item_dir, const Mesh& mesh, const TargetOptions& options = {});

}  // namespace tessel
