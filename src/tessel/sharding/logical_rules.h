// Logical axis rules map the logical names parameters carry ("embed", "mlp", ...) to mesh axes.
// resolve() reproduces Flax Linen's logical_to_mesh_axes exactly, then applies MaxText's
// optional post-processing; explain() runs the same code and records why each rule was taken or
// skipped.
//
//   tessel::LogicalRules rules({{"mlp", {"tensor"}}, {"embed", {"fsdp"}}, {"embed", {"data"}}});
//   auto mesh = tessel::Mesh::parse("fsdp=4,tensor=2");
//   rules.resolve({"embed", "mlp"}, mesh) == tessel::PartitionSpec{{"fsdp"}, {"tensor"}}
//
// Flax's algorithm: rules are scanned in order; a rule applies to the dimension carrying its
// logical name when that dimension is still unassigned and none of the rule's mesh axes is used
// by another dimension of the same array. So a later rule for the same name is a fallback. An
// empty axis list assigns "unsharded" (and so blocks later rules for that name). Names without a
// matching rule, and dimensions without a name, end unsharded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessel/core/shape.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel {

// One logical name per array dimension; nullopt for a dimension without a name.
using LogicalAxes = std::vector<std::optional<std::string>>;

struct LogicalRule {
  std::string logical;
  std::vector<std::string> mesh_axes;  // major first; empty: explicitly unsharded
  int64_t line = 0;                    // line in the rules file, 0 when not read from one
};

struct ResolveOptions {
  // MaxText's remove_size_one_mesh_axis: after resolution, drop mesh axes of size 1 (an axis the
  // mesh lacks counts as size 1 here, as in MaxText).
  bool remove_size_one_axes = false;
  // After resolution (and size-1 removal), keep a dimension's axes in order only while their
  // product divides the dimension; the others are dropped. Needs the shape.
  bool drop_indivisible = false;
  // Fail (ShardingError) when a named dimension ends unsharded because every rule for its name
  // was blocked by another dimension, or because its name has no rule at all (typo guard).
  bool strict = false;
};

// Why one rule was or was not used for a dimension (recorded by explain()).
struct RuleTrial {
  enum class Outcome { kApplied, kAxisTaken, kDimensionAssigned };
  size_t rule = 0;            // index into LogicalRules::rules()
  Outcome outcome = Outcome::kApplied;
  std::string axis;           // kAxisTaken: the contested mesh axis
  size_t holder_dim = 0;      // kAxisTaken: the dimension that holds it
  size_t holder_rule = 0;     // kAxisTaken / kDimensionAssigned: the rule that assigned the holder
};

struct DimResolution {
  std::optional<std::string> logical;
  std::vector<RuleTrial> trials;
  std::optional<size_t> applied_rule;     // the rule Flax applied, if any
  DimSharding flax;                       // Flax's result for this dimension
  std::vector<std::string> removed_size_one;
  std::vector<std::string> dropped_indivisible;
  DimSharding result;                     // after the options
};

struct Resolution {
  std::vector<DimResolution> dims;
  PartitionSpec spec;
};

class LogicalRules {
 public:
  LogicalRules() = default;
  // Throws ValueError on an empty logical name, an empty mesh axis name, or a rule naming the
  // same mesh axis twice. `mesh_axes` is the optional declared mesh axis order (MaxText's
  // `mesh_axes`); `source` names the file in messages.
  explicit LogicalRules(std::vector<LogicalRule> rules, std::vector<std::string> mesh_axes = {},
                        std::string source = {});
  LogicalRules(std::initializer_list<LogicalRule> rules)
      : LogicalRules(std::vector<LogicalRule>(rules)) {}

  const std::vector<LogicalRule>& rules() const { return rules_; }
  const std::vector<std::string>& mesh_axes() const { return mesh_axes_; }
  const std::string& source() const { return source_; }
  bool has_rule_for(std::string_view logical) const { return by_name_.contains(std::string(logical)); }

  // Flax Linen's logical_to_mesh_axes, with no mesh: throws ShardingError on a logical name
  // used by two dimensions. `what` (a parameter path) prefixes messages.
  PartitionSpec logical_to_mesh_axes(const LogicalAxes& names, std::string_view what = {}) const;

  // Resolution against a mesh. `shape`, when given, must have one size per name; it is needed
  // by drop_indivisible. Throws ShardingError when the result would use a mesh axis the mesh
  // lacks, and on strict-mode conflicts; ValueError on a rank mismatch.
  PartitionSpec resolve(const LogicalAxes& names, const Mesh& mesh,
                        const ResolveOptions& options = {},
                        const std::optional<Shape>& shape = std::nullopt,
                        std::string_view what = {}) const;

  // The same resolution, with the reasoning per dimension. Strict-mode and missing-axis errors
  // still throw: the message is the explanation.
  Resolution explain(const LogicalAxes& names, const Mesh& mesh, const ResolveOptions& options = {},
                     const std::optional<Shape>& shape = std::nullopt,
                     std::string_view what = {}) const;

  // Human-readable explanation: one block per dimension, each rule tried and why.
  std::string describe(const Resolution& resolution, const Mesh& mesh,
                       const std::optional<Shape>& shape = std::nullopt) const;
  // "rule #7 embed -> (fsdp, context) [base.yml:545]"
  std::string rule_label(size_t index) const;

 private:
  struct Flax;  // Flax-stage result with the bookkeeping both entry points need
  Flax run_flax(const LogicalAxes& names, std::string_view what, Resolution* trace) const;
  PartitionSpec run(const LogicalAxes& names, const Mesh& mesh, const ResolveOptions& options,
                    const std::optional<Shape>& shape, std::string_view what,
                    Resolution* trace) const;

  std::vector<LogicalRule> rules_;
  std::vector<std::string> mesh_axes_;
  std::string source_;
  std::unordered_map<std::string, std::vector<size_t>> by_name_;  // logical name -> rule indices
};

}  // namespace tessel
