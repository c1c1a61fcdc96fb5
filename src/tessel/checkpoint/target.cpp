#include "tessel/checkpoint/target.h"

#include <algorithm>

#include <fmt/format.h>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/core/error.h"
#include "tessel/state/init.h"

namespace tessel {

State restore_target(const std::filesystem::path& item_dir, const Mesh& mesh, const TargetOptions& options) {
  const std::optional<LogicalRules> rules = options.rules ? options.rules : read_item_metadata(item_dir).rules;
  const State saved = saved_abstract_state(item_dir);
  for (const auto& w : options.paths) {
    if (!saved.contains(w)) throw ValueError(fmt::format("'{}' is not in '{}'", w, item_dir.string()));
  }
  State target;
  for (const auto& [path, v] : saved) {
    if (!options.paths.empty() && std::find(options.paths.begin(), options.paths.end(), path) == options.paths.end()) {
      continue;
    }
    std::optional<NamedSharding> s;
    if (!v.partitioning().empty() && (rules || v.partitioning().mesh_axes)) {
      s = resolve_sharding(v.partitioning(), v.shape(), mesh, rules ? *rules : LogicalRules{}, options.resolve, path);
    } else if (v.sharding()) {
      try {
        s = NamedSharding(mesh, v.sharding()->spec());
        s->device_box(mesh.device_ids().front(), v.shape());
      } catch (const ValueError& e) {
        throw ValueError(fmt::format("'{}': its saved spec {} does not fit {}: give rules ({})", path,
                                     v.sharding()->spec().to_string(), mesh.to_string(), e.what()));
      }
    } else {
      s = NamedSharding(mesh, PartitionSpec{});
    }
    target.insert(path, Variable::abstract(v.kind(), v.shape(), v.dtype(), s, v.partitioning()));
  }
  return target;
}

}  // namespace tessel
