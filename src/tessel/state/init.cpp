#include "tessel/state/init.h"

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/runtime/array.h"

namespace tessel {
namespace {

// The abstract variable of one declaration: the code path eval_shape and init share.
Variable abstract_variable(const std::string& path, const ParamDecl& decl, const Mesh& mesh,
                           const LogicalRules& rules, const ResolveOptions& options) {
  NamedSharding sharding = resolve_sharding(decl.partitioning, decl.shape, mesh, rules, options, path);
  Variable v = Variable::abstract(decl.kind, decl.shape, decl.dtype, std::move(sharding), decl.partitioning);
  v.metadata()["initializer"] = decl.init.to_string();
  return v;
}

}  // namespace

NamedSharding resolve_sharding(const Partitioning& partitioning, const Shape& shape, const Mesh& mesh,
                               const LogicalRules& rules, const ResolveOptions& options, std::string_view path) {
  if (!partitioning.logical.empty())
    return NamedSharding(mesh, rules.resolve(partitioning.logical, mesh, options, shape, path));
  if (partitioning.mesh_axes) {
    partitioning.mesh_axes->validate(mesh, shape.rank(), path);
    return NamedSharding(mesh, *partitioning.mesh_axes);
  }
  return NamedSharding(mesh, PartitionSpec());
}

State eval_shape(const Module& model, const Mesh& mesh, const LogicalRules& rules, const ResolveOptions& options) {
  State state;
  model.visit([&](const std::string& path, const ParamDecl& decl) {
    state.insert(path, abstract_variable(path, decl, mesh, rules, options));
  }, /*include_root=*/false);
  return state;
}

State init(const Runtime& rt, const Module& model, uint64_t seed, const Mesh& mesh, const LogicalRules& rules,
           const ResolveOptions& options) {
  rt.check_mesh(mesh);
  State state;
  model.visit([&](const std::string& path, const ParamDecl& decl) {
    Variable abstract = abstract_variable(path, decl, mesh, rules, options);
    // Each distinct block is generated once, into its first holder's buffer.
    Array value = make_array_from_callback(
        rt, decl.shape, decl.dtype, *abstract.sharding(),
        [&](const Box& box, std::span<std::byte> out) {
          decl.init.fill(seed, path, decl.shape, decl.dtype, decl.fans, box, out);
        },
        path);
    Variable v(decl.kind, std::move(value), decl.partitioning);
    v.metadata() = abstract.metadata();
    state.insert(path, std::move(v));
  }, /*include_root=*/false);
  return state;
}

std::vector<std::pair<std::string, PartitionSpec>> get_partition_spec(const State& state) {
  std::vector<std::pair<std::string, PartitionSpec>> out;
  out.reserve(state.size());
  for (const auto& [path, v] : state) {
    if (!v.sharding())
      throw ValueError(fmt::format("{}: the variable is not placed on a mesh; use get_named_sharding with a "
                                   "mesh and rules", path));
    out.emplace_back(path, v.sharding()->spec());
  }
  return out;
}

std::vector<std::pair<std::string, NamedSharding>> get_named_sharding(const State& state, const Mesh& mesh,
                                                                     const LogicalRules& rules,
                                                                     const ResolveOptions& options) {
  std::vector<std::pair<std::string, NamedSharding>> out;
  out.reserve(state.size());
  for (const auto& [path, v] : state)
    out.emplace_back(path, resolve_sharding(v.partitioning(), v.shape(), mesh, rules, options, path));
  return out;
}

}  // namespace tessel
