// A Variable is one leaf of model state: a kind ("param", or a user kind such as "batch_stat" or
// "opt_state"), a value that is either an Array on devices or an abstract value (shape, dtype and,
// once placed, a NamedSharding), and metadata: logical axis names per dimension or explicit mesh
// axes, plus free-form key/values. Abstract and concrete variables have the same fields, so code
// that plans, checkpoints or restores reads both alike.
//
//   auto v = tessel::Variable::abstract(tessel::kParam, {1024, 4096}, tessel::DType::kF32,
//                                       sharding, {"embed", "mlp"});
//   v.is_abstract() && v.sharding()->spec() == tessel::PartitionSpec{{"fsdp"}, {"tensor"}}
#pragma once

#include <map>
#include <optional>
#include <string>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/runtime/array.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel {

inline constexpr const char* kParam = "param";

// How a variable's dimensions map to the mesh: logical names resolved through rules, or mesh
// axes given directly (Flax's with_partitioning without rules). Neither: replicated.
struct Partitioning {
  LogicalAxes logical;                    // one entry per dimension when set
  std::optional<PartitionSpec> mesh_axes;  // explicit mesh axes; excludes `logical`
  static Partitioning by_logical(LogicalAxes names) { return {std::move(names), std::nullopt}; }
  static Partitioning by_mesh_axes(PartitionSpec spec) { return {{}, std::move(spec)}; }
  bool empty() const { return logical.empty() && !mesh_axes; }
  friend bool operator==(const Partitioning&, const Partitioning&) = default;
};

class Variable {
 public:
  // An abstract value: no bytes anywhere. `sharding` may be absent (not placed yet).
  static Variable abstract(std::string kind, Shape shape, DType dtype,
                           std::optional<NamedSharding> sharding = std::nullopt,
                           Partitioning partitioning = {});
  // A concrete value; shape, dtype and sharding are the Array's.
  Variable(std::string kind, Array value, Partitioning partitioning = {});

  const std::string& kind() const { return kind_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const std::optional<NamedSharding>& sharding() const { return sharding_; }
  const Partitioning& partitioning() const { return partitioning_; }
  bool is_abstract() const { return !array_; }
  // The Array; throws ValueError for an abstract variable (naming `what`, e.g. its path).
  const Array& array(std::string_view what = {}) const;

  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  int64_t size() const { return shape_.num_elements(); }
  int64_t nbytes() const { return size() * static_cast<int64_t>(item_size(dtype_)); }
  // The same variable without its value: what eval_shape would have given.
  Variable to_abstract() const;
  // "param f32[1024,4096] PartitionSpec('fsdp', 'tensor')"
  std::string to_string() const;

 private:
  Variable(std::string kind, Shape shape, DType dtype, std::optional<NamedSharding> sharding,
           std::optional<Array> array, Partitioning partitioning);
  std::string kind_;
  Shape shape_;
  DType dtype_;
  std::optional<NamedSharding> sharding_;
  std::optional<Array> array_;
  Partitioning partitioning_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessel
