// Where each leaf of a restore goes: one specification, one precedence order, used by the C++ API,
// the CLI and the Python package alike. A target is built from what the item recorded (its
// leaves' logical axes, explicit mesh axes or saved specs) and from what the user gives: shardings
// or specs per path, logical axes per path (MaxText's logical_shardings.json) with rules, or a map
// from saved mesh axes to target axes, for a checkpoint saved on another mesh (another project's).
// Subtrees are selected by path or glob, and moved by prefix renames.
//
//   auto item = tessel::CheckpointItem::open("ckpt/7/default");
//   tessel::TargetSpec spec{.mesh = tessel::Mesh::parse("data=2,tensor=4")};
//   tessel::State target = tessel::make_target(item, spec);        // abstract, every leaf placed
//   tessel::State state = tessel::restore(rt, item, spec);         // the same, restored
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessel/checkpoint/item.h"
#include "tessel/core/dtype.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/state/state.h"

namespace tessel {

// Where a leaf goes that no given sharding, spec or logical axes places.
enum class Placement {
  kMesh,                // on TargetSpec::mesh: its saved logical axes or explicit mesh axes through
                        // the rules, else its saved spec (axes renamed by axis_map), else replicated
  kAsSaved,             // its saved sharding (its mesh must fit the runtime); none saved: an error
  kAsSavedOrOneDevice,  // the same, but one saved without one (Orbax's NumPy arrays and scalars) goes
                        // to one device
  kReplicated,          // a full copy on every device of TargetSpec::mesh (default: the runtime's)
};

// Given per saved path (entries for other paths are ignored, but not all of them), first to last:
// `shardings`, `specs` on `mesh`, `logical_axes` through the rules onto `mesh`; then `placement`.
struct TargetSpec {
  std::optional<Mesh> mesh;
  std::optional<LogicalRules> rules;  // for logical axes; default: the item's own
  ResolveOptions resolve;
  std::map<std::string, NamedSharding> shardings;   // on any mesh
  std::map<std::string, PartitionSpec> specs;       // on `mesh`
  std::map<std::string, LogicalAxes> logical_axes;  // resolved onto `mesh` through the rules
  std::map<std::string, std::string> axis_map;      // saved mesh axis -> axis of `mesh`; "" drops it;
                                                    // "*": every other axis `mesh` lacks
  std::map<std::string, DType> dtypes;              // restored as this dtype (cast) instead of the saved one
  Placement placement = Placement::kMesh;
  // Which leaves: those named in `paths` (an absent one is an error) and those matching a glob of
  // `select` (see select_paths); every saved array when both are empty.
  std::vector<std::string> paths;
  std::vector<std::string> select;
  // The restored tree's paths: prefix renames (see rename_prefixes), applied after the placement
  // (the maps above are keyed by saved paths).
  std::vector<std::pair<std::string, std::string>> rename;
};

// One abstract variable per chosen leaf, keyed by its saved path, with its sharding and dtype.
// `devices`, the runtime's device count when known, is kReplicated's default mesh and checks that
// saved meshes fit. Throws ValueError naming a wanted path the item does not hold, given shardings,
// specs or logical axes that name none of its leaves, a selection matching nothing, or (listing
// the first of them, with the three ways out) the leaves whose saved specs name axes `mesh` lacks.
State make_target(const CheckpointItem& item, const TargetSpec& spec, std::optional<int64_t> devices = std::nullopt);

// `abstract` (leaves with no saved metadata: a key map's targets) placed by `spec`: its shardings,
// specs or logical axes (with its rules) by path, else a full copy on its mesh. Throws ValueError
// for a spec without a mesh, logical axes without rules, and given entries that name none of the
// leaves.
State place_abstract(const State& abstract, const TargetSpec& spec);

// A mesh of one device over the rules' declared mesh axes (each of size 1, so that every rule
// resolves to axes the mesh has); `host=1` for rules that declare none, or none at all.
Mesh one_device_mesh(const std::optional<LogicalRules>& rules);

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
// The leaves of `state` select_paths picks; all of them when `patterns` is empty.
State select_leaves(const State& state, const std::vector<std::string>& patterns);

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
