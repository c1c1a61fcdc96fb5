// The target of a restore onto a mesh that need not be the one an item was saved on, built from
// what the item recorded (its leaves' logical axes, explicit mesh axes or saved specs) or, for a
// checkpoint saved on a mesh whose axes the target lacks (another project's), from what the user
// gives: logical axes per path (MaxText's logical_shardings.json) with rules, specs per path
// (MaxText's named_shardings.json, or {path: spec}), or a map from saved axes to target axes.
//
//   auto mesh = tessel::Mesh::parse("data=2,tensor=4");
//   tessel::State target = tessel::restore_target("ckpt/7/default", mesh);   // abstract, placed
//   tessel::State state = tessel::restore(rt, "ckpt/7/default", target);
#pragma once

#include <filesystem>
#include <map>
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
  // Given per tessel path (entries for other paths are ignored, but not all of them):
  std::map<std::string, PartitionSpec> specs;       // on `mesh`, first in precedence
  std::map<std::string, LogicalAxes> logical_axes;  // resolved through `rules` (needed then)
  std::map<std::string, std::string> axis_map;      // saved mesh axis -> axis of `mesh`; "" drops it;
                                                    // "*": every other axis `mesh` lacks
};

// One abstract variable per leaf with its sharding on `mesh`, the first that applies: its entry in
// `specs`, its entry in `logical_axes`, its saved logical axes through the rules, its explicit
// mesh axes, its saved spec (axes renamed by `axis_map`) applied to `mesh`; else replicated.
// Throws ValueError naming a wanted path the item does not hold, given specs or logical axes that
// name none of its leaves, or (listing the first of them, with the three ways out) the leaves
// whose saved specs name axes `mesh` lacks.
State restore_target(const std::filesystem::path& item_dir, const Mesh& mesh, const TargetOptions& options = {});

// A path as MaxText's sharding dumps write it (".params/['params']/['decoder']/...",
// ".opt_state/[0]/.mu/...") as a tessel path ("params/params/decoder/...", "opt_state/0/mu/...");
// a tessel path is returned as it is.
std::string path_from_dump_key(std::string_view key);
// A JSON file of specs by path: MaxText's named_shardings.json as it is, or {path: spec} with a
// spec written as JAX does ([null, "fsdp", ["data", "tensor"]]). Paths through path_from_dump_key.
std::map<std::string, PartitionSpec> load_target_specs(const std::filesystem::path& file);
// MaxText's logical_shardings.json: logical names by path (through path_from_dump_key).
std::map<std::string, LogicalAxes> load_target_logical_axes(const std::filesystem::path& file);
// "old=new,other=" as an axis map; throws ValueError for an entry without '='.
std::map<std::string, std::string> parse_axis_map(std::string_view text);

// Subtrees: the paths of `state` that match any glob (fnmatch, on the '/'- or the '.'-joined path:
// "params.params.decoder.*", "opt_state/0/mu/*"), in State order. Throws ValueError when none does.
std::vector<std::string> select_paths(const State& state, const std::vector<std::string>& patterns);

// Moves subtrees: each path under the first `old` prefix (whole levels, '/'- or '.'-joined) that
// it starts with is put under `new` instead ("" strips it: {"params.params", ""} turns a MaxText
// TrainState's params/params/decoder/... into decoder/...). Paths under no prefix stay. Throws
// ValueError when two paths would become one, or a path would become empty.
State rename_prefixes(const State& state, const std::vector<std::pair<std::string, std::string>>& renames);
// One path moved as rename_prefixes moves it (the same path when no prefix applies).
std::string rename_path(const std::string& path, const std::vector<std::pair<std::string, std::string>>& renames);
// "old=new,other=" as prefix renames, in order.
std::vector<std::pair<std::string, std::string>> parse_renames(std::string_view text);

}  // namespace tessel
