#include "tessel/checkpoint/target.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/sharding/detail/spec_json.h"
#include "tessel/sharding/spec_io.h"
#include "tessel/state/init.h"

namespace tessel {
namespace {

constexpr int64_t kMaxTargetFileBytes = int64_t{256} << 20;

// The saved spec with its axes renamed (or dropped) by the map; "*" stands for every axis the
// mesh lacks that the map does not name.
PartitionSpec map_axes(const PartitionSpec& spec, const std::map<std::string, std::string>& axis_map, const Mesh& mesh) {
  if (axis_map.empty()) return spec;
  const auto any = axis_map.find("*");
  std::vector<DimSharding> dims;
  for (const DimSharding& d : spec.dims()) {
    DimSharding out;
    for (const std::string& a : d) {
      auto it = axis_map.find(a);
      if (it == axis_map.end() && any != axis_map.end() && !mesh.has_axis(a)) it = any;
      if (it == axis_map.end()) {
        out.push_back(a);
      } else if (!it->second.empty()) {
        out.push_back(it->second);
      }
    }
    dims.push_back(std::move(out));
  }
  return PartitionSpec(std::move(dims));
}

std::vector<std::string> missing_axes(const PartitionSpec& spec, const Mesh& mesh) {
  std::vector<std::string> out;
  for (const std::string& a : spec.used_axes())
    if (!mesh.has_axis(a)) out.push_back(a);
  return out;
}

// A file of targets may cover more than the item (a whole TrainState's dump for its params), but
// one that names none of its leaves is for another tree: an error showing both sides' paths.
template <class Map>
void check_given(const Map& given, const State& saved, std::string_view what, const Location& item_dir) {
  if (given.empty()) return;
  for (const auto& [path, value] : given)
    if (saved.contains(path)) return;
  throw ValueError(fmt::format("the {} name none of the arrays in '{}' (they name e.g. '{}'; it holds e.g. '{}')", what,
                               item_dir.string(), given.begin()->first,
                               saved.empty() ? std::string("nothing") : saved.begin()->first));
}

}  // namespace

namespace {

std::string join_foreign(const std::vector<std::string>& foreign) {
  const size_t show = std::min<size_t>(foreign.size(), 5);
  return fmt::format("{}{}", fmt::join(std::vector<std::string>(foreign.begin(), foreign.begin() + static_cast<long>(show)), "\n  "),
                     foreign.size() > show ? fmt::format("\n  ... and {} more", foreign.size() - show) : std::string());
}

// The leaves a spec chooses, in the item's order: `paths` and `select`, else every saved array.
std::vector<const ParamMetadata*> chosen_leaves(const CheckpointItem& item, const State& saved, const TargetSpec& spec) {
  std::set<std::string> wanted;
  for (const std::string& p : spec.paths) {
    if (!saved.contains(p)) throw ValueError(fmt::format("'{}' is not in '{}'", p, item.dir().string()));
    wanted.insert(p);
  }
  if (!spec.select.empty()) {
    for (std::string& p : select_paths(saved, spec.select)) wanted.insert(std::move(p));
  }
  std::vector<const ParamMetadata*> out;
  for (const auto& [path, v] : saved) {
    if (wanted.empty() || wanted.contains(path)) out.push_back(item.metadata().find(path));
  }
  return out;
}

// The last rung: where `placement` puts a leaf nothing given placed.
// The sharding `spec` gives `path` (a sharding, a spec on its mesh, or logical axes through the
// rules), if any.
std::optional<NamedSharding> given_sharding(const std::string& path, const Variable& v, const TargetSpec& spec,
                                            const std::optional<LogicalRules>& rules) {
  if (auto it = spec.shardings.find(path); it != spec.shardings.end()) {
    NamedSharding s = it->second;
    s.device_box(s.mesh().device_ids().front(), v.shape());  // checks the sharding fits the shape
    return s;
  }
  if (auto sp = spec.specs.find(path); sp != spec.specs.end()) {
    if (const auto missing = missing_axes(sp->second, *spec.mesh); !missing.empty()) {
      throw ValueError(fmt::format(
          "the target spec of '{}', {}, names mesh axes {} lacks ({}): give the target mesh those axes (with "
          "--rules, e.g. MaxText's base.yml, or --model and --base, the mesh has each of the rules' mesh_axes, of "
          "size 1 unless --mesh sizes it)",
          path, sp->second.to_string(), spec.mesh->to_string(), fmt::join(missing, ", ")));
    }
    NamedSharding s(*spec.mesh, sp->second);
    s.device_box(spec.mesh->device_ids().front(), v.shape());
    return s;
  }
  if (auto la = spec.logical_axes.find(path); la != spec.logical_axes.end())
    return resolve_sharding(Partitioning::by_logical(la->second), v.shape(), *spec.mesh, *rules, spec.resolve, path);
  return std::nullopt;
}

std::optional<NamedSharding> place(const ParamMetadata& p, const Variable& v, const TargetSpec& spec,
                                   const std::optional<LogicalRules>& rules, std::optional<int64_t> devices,
                                   std::vector<std::string>& foreign) {
  switch (spec.placement) {
    case Placement::kMesh: {
      if (!spec.mesh) throw ValueError("placing '" + p.path + "' on the target mesh needs a mesh");
      const Mesh& mesh = *spec.mesh;
      if (!v.partitioning().empty() && (rules || v.partitioning().mesh_axes))
        return resolve_sharding(v.partitioning(), v.shape(), mesh, rules ? *rules : LogicalRules{}, spec.resolve, p.path);
      // On one device nothing is split: any saved spec is a full copy there.
      if (!v.sharding() || mesh.device_count() == 1) return NamedSharding(mesh, PartitionSpec{});
      const PartitionSpec saved = map_axes(v.sharding()->spec(), spec.axis_map, mesh);
      if (const auto missing = missing_axes(saved, mesh); !missing.empty()) {
        foreign.push_back(fmt::format("{} {} (saved {} on {}; {} lacks {})", p.path, type_string(v.dtype(), v.shape()),
                                      v.sharding()->spec().to_string(), v.sharding()->mesh().to_string(), mesh.to_string(),
                                      fmt::join(missing, ", ")));
        return std::nullopt;
      }
      try {
        NamedSharding s(mesh, saved);
        s.device_box(mesh.device_ids().front(), v.shape());
        return s;
      } catch (const ValueError& e) {
        throw ValueError(fmt::format("'{}': its saved spec {} does not fit {}: give rules ({})", p.path, saved.to_string(),
                                     mesh.to_string(), e.what()));
      }
    }
    case Placement::kAsSaved:
    case Placement::kAsSavedOrOneDevice: {
      if (!p.sharding) {
        if (spec.placement == Placement::kAsSavedOrOneDevice) return NamedSharding(Mesh({{"device", 1}}), PartitionSpec{});
        throw ValueError("'" + p.path + "' has no saved NamedSharding in _sharding; restore it with a target sharding "
                         "or Placement::kReplicated");
      }
      if (devices && p.sharding->mesh.device_count() > *devices) {
        throw ValueError("'" + p.path + "' was saved on " + p.sharding->mesh.to_string() + " (" +
                         std::to_string(p.sharding->mesh.device_count()) + " devices), more than the runtime's " +
                         std::to_string(*devices) + "; give a target sharding");
      }
      NamedSharding s(p.sharding->mesh, p.sharding->spec);
      s.device_box(s.mesh().device_ids().front(), v.shape());  // checks the spec fits the shape
      return s;
    }
    case Placement::kReplicated: {
      if (!spec.mesh && !devices) throw ValueError("replicating '" + p.path + "' needs a mesh or the runtime's devices");
      return NamedSharding(spec.mesh ? *spec.mesh : Mesh({{"replica", *devices}}), PartitionSpec{});
    }
  }
  throw ValueError("unknown placement");
}

}  // namespace

State make_target(const CheckpointItem& item, const TargetSpec& spec, std::optional<int64_t> devices) {
  const std::optional<LogicalRules> rules = spec.rules ? spec.rules : item.metadata().rules;
  const State saved = item.abstract_state();
  const std::vector<const ParamMetadata*> leaves = chosen_leaves(item, saved, spec);
  for (const auto& [path, sharding] : spec.shardings) {
    if (!saved.contains(path))
      throw ValueError(fmt::format("the target shardings name '{}', which '{}' does not hold", path, item.dir().string()));
  }
  for (const auto& [path, dtype] : spec.dtypes) {
    if (!saved.contains(path))
      throw ValueError(fmt::format("the target dtypes name '{}', which '{}' does not hold", path, item.dir().string()));
  }
  check_given(spec.specs, saved, "target specs", item.dir());
  check_given(spec.logical_axes, saved, "target logical axes", item.dir());
  if ((!spec.specs.empty() || !spec.logical_axes.empty()) && !spec.mesh)
    throw ValueError("target specs and logical axes place arrays on a mesh: give one");
  if (!spec.logical_axes.empty() && !rules) throw ValueError("target logical axes need rules to resolve them (--rules, or a MaxText model's: --model and --base)");
  State target;
  std::vector<std::string> foreign;  // leaves whose saved spec names axes the mesh lacks
  for (const ParamMetadata* p : leaves) {
    const Variable& v = saved.at(p->path);
    std::optional<NamedSharding> s = given_sharding(p->path, v, spec, rules);
    if (!s) s = place(*p, v, spec, rules, devices, foreign);
    if (!s) continue;
    const auto dtype = spec.dtypes.find(p->path);
    target.insert(p->path, Variable::abstract(v.kind(), v.shape(), dtype == spec.dtypes.end() ? v.dtype() : dtype->second,
                                              s, v.partitioning()));
  }
  if (!foreign.empty()) {
    throw ValueError(fmt::format(
        "{} of the arrays in '{}' were saved sharded over mesh axes that the target mesh lacks:\n  {}\n"
        "say where they go: (a) their logical axes with rules (--logical-axes FILE / logical_axes=: MaxText's "
        "logical_shardings.json), (b) their specs on the target mesh (--shardings FILE / shardings=: {{path: spec}} or "
        "MaxText's named_shardings.json), or (c) a map from saved axes to target axes (--axis-map old=new,... / "
        "axis_map=; old= drops one)",
        foreign.size(), item.dir().string(), join_foreign(foreign)));
  }
  return target;
}

State place_abstract(const State& abstract, const TargetSpec& spec) {
  if (!spec.mesh) throw ValueError("placing arrays on a mesh needs one");
  if (!spec.logical_axes.empty() && !spec.rules) throw ValueError("target logical axes need rules to resolve them (--rules, or a MaxText model's: --model and --base)");
  check_given(spec.shardings, abstract, "target shardings", "the converted tree");
  check_given(spec.specs, abstract, "target specs", "the converted tree");
  check_given(spec.logical_axes, abstract, "target logical axes", "the converted tree");
  State out;
  for (const auto& [path, v] : abstract) {
    const NamedSharding s = given_sharding(path, v, spec, spec.rules).value_or(NamedSharding(*spec.mesh, PartitionSpec{}));
    // Logical axes are kept, so that the item records them for a restore onto another mesh.
    const auto la = spec.logical_axes.find(path);
    out.insert(path, Variable::abstract(v.kind(), v.shape(), v.dtype(), s,
                                        la == spec.logical_axes.end() ? v.partitioning()
                                                                      : Partitioning::by_logical(la->second)));
  }
  return out;
}

Mesh one_device_mesh(const std::optional<LogicalRules>& rules) {
  if (!rules || rules->mesh_axes().empty()) return Mesh({{"host", 1}});
  return Mesh::parse(rules->mesh_axes()[0] + "=1", rules->mesh_axes());
}

std::string path_from_dump_key(std::string_view key) {
  const bool dump = key.starts_with('.') || key.find("['") != std::string_view::npos || key.find('[') != std::string_view::npos;
  if (!dump) return std::string(key);
  std::string out;
  for (std::string_view part : text_util::split(key, '/')) {
    if (part.starts_with('.')) part.remove_prefix(1);
    if (part.starts_with("['") && part.ends_with("']") && part.size() >= 4) {
      part = part.substr(2, part.size() - 4);
    } else if (part.starts_with('[') && part.ends_with(']') && part.size() >= 2) {
      part = part.substr(1, part.size() - 2);
    }
    if (part.empty()) throw ValueError(fmt::format("'{}' has an empty level: not a path", key));
    if (!out.empty()) out += '/';
    out += part;
  }
  return out;
}

std::map<std::string, PartitionSpec> load_target_specs(const std::filesystem::path& file) {
  const std::string text = detail::read_file(file, kMaxTargetFileBytes);
  const json_util::Json j = json_util::parse(text, file.string());
  if (!j.is_object()) throw ValueError(file.string() + ": expected an object of path -> spec");
  const bool named_dump = !j.empty() && j.begin().value().is_object();
  std::map<std::string, PartitionSpec> out;
  if (named_dump) {
    for (const NamedDumpEntry& e : parse_named_dump(text, file.string()))
      out.emplace(path_from_dump_key(e.entry.path), e.entry.spec);
    return out;
  }
  for (const auto& [key, value] : j.items())
    out.emplace(path_from_dump_key(key), spec_json::from_json(value, file.string() + ": '" + key + "'"));
  return out;
}

std::map<std::string, LogicalAxes> load_target_logical_axes(const std::filesystem::path& file) {
  std::map<std::string, LogicalAxes> out;
  for (const LogicalEntry& e : load_logical_dump(file)) out.emplace(path_from_dump_key(e.path), e.axes);
  return out;
}

std::map<std::string, std::string> parse_axis_map(std::string_view text) {
  std::map<std::string, std::string> out;
  for (auto& [from, to] : text_util::parse_assignments(text, "--axis-map", "old=new (or old= to drop the axis)"))
    out[from] = to;
  return out;
}

std::vector<std::string> select_paths(const State& state, const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& [path, v] : state) {
    std::string dotted = path;
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    for (const std::string& p : patterns) {
      if (::fnmatch(p.c_str(), path.c_str(), 0) == 0 || ::fnmatch(p.c_str(), dotted.c_str(), 0) == 0) {
        out.push_back(path);
        break;
      }
    }
  }
  if (out.empty()) {
    std::vector<std::string> some;
    for (const auto& [path, v] : state) {
      if (some.size() == 5) break;
      some.push_back(path);
    }
    throw ValueError(fmt::format("the selection {} matches none of the {} arrays (e.g. {})", fmt::join(patterns, ", "),
                                 state.size(), fmt::join(some, ", ")));
  }
  return out;
}

State select_leaves(const State& state, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return state;
  State picked;
  for (const std::string& p : select_paths(state, patterns)) picked.insert(p, state.at(p));
  return picked;
}

namespace {

// A prefix of levels as a '/'-joined path without a trailing '/'.
std::string as_levels(std::string prefix) {
  std::replace(prefix.begin(), prefix.end(), '.', '/');
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  while (!prefix.empty() && prefix.front() == '/') prefix.erase(prefix.begin());
  return prefix;
}

}  // namespace

std::string rename_path(const std::string& path, const std::vector<std::pair<std::string, std::string>>& renames) {
  for (const auto& [raw_from, raw_to] : renames) {
    const std::string from = as_levels(raw_from), to = as_levels(raw_to);
    if (from.empty()) throw ValueError(fmt::format("cannot rename the empty prefix '{}'", raw_from));
    if (path == from || path.starts_with(from + "/")) {
      const std::string rest = path.substr(std::min(path.size(), from.size() + 1));
      return to.empty() ? rest : rest.empty() ? to : to + "/" + rest;
    }
  }
  return path;
}

State rename_prefixes(const State& state, const std::vector<std::pair<std::string, std::string>>& renames) {
  State out;
  std::map<std::string, std::string> origin;
  for (const auto& [path, v] : state) {
    const std::string renamed = rename_path(path, renames);
    if (renamed.empty()) throw ValueError(fmt::format("renaming '{}' leaves no path", path));
    if (auto [it, fresh] = origin.emplace(renamed, path); !fresh)
      throw ValueError(fmt::format("renaming makes '{}' and '{}' both '{}'", it->second, path, renamed));
    out.insert(renamed, v);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_renames(std::string_view text) {
  return text_util::parse_assignments(text, "--rename", "old=new (or old= to strip the prefix)");
}

}  // namespace tessel
