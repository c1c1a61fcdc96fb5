#include "tessel/state/variable.h"

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {

Variable::Variable(std::string kind, Shape shape, DType dtype, std::optional<NamedSharding> sharding,
                   std::optional<Array> array, Partitioning partitioning)
    : kind_(std::move(kind)),
      shape_(std::move(shape)),
      dtype_(dtype),
      sharding_(std::move(sharding)),
      array_(std::move(array)),
      partitioning_(std::move(partitioning)) {
  if (kind_.empty()) throw ValueError("a variable's kind must not be empty");
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape_.num_elements(), static_cast<int64_t>(item_size(dtype_)), &bytes))
    throw ValueError(fmt::format("a {} variable of shape {} has more than 2^63 bytes", name(dtype_), shape_.to_string()));
  if (!partitioning_.logical.empty() && partitioning_.mesh_axes)
    throw ValueError("a variable has either logical axes or explicit mesh axes, not both");
  if (!partitioning_.logical.empty() && partitioning_.logical.size() != shape_.rank())
    throw ValueError(fmt::format("{} logical axis names given for a variable of shape {}",
                                 partitioning_.logical.size(), shape_.to_string()));
  if (partitioning_.mesh_axes && partitioning_.mesh_axes->size() > shape_.rank())
    throw ValueError(fmt::format("mesh axes {} have more entries than shape {} has dimensions",
                                 partitioning_.mesh_axes->to_string(), shape_.to_string()));
  if (sharding_ && sharding_->spec().size() > shape_.rank())
    throw ValueError(fmt::format("sharding {} has more entries than shape {} has dimensions",
                                 sharding_->spec().to_string(), shape_.to_string()));
}

Variable Variable::abstract(std::string kind, Shape shape, DType dtype,
                            std::optional<NamedSharding> sharding, Partitioning partitioning) {
  return Variable(std::move(kind), std::move(shape), dtype, std::move(sharding), std::nullopt,
                  std::move(partitioning));
}

Variable::Variable(std::string kind, Array value, Partitioning partitioning)
    : Variable(std::move(kind), value.shape(), value.dtype(), value.sharding(), value,
               std::move(partitioning)) {}

const Array& Variable::array(std::string_view what) const {
  if (!array_)
    throw ValueError(fmt::format("{}{}is abstract ({}): it has no value", what, what.empty() ? "" : ": ",
                                 type_string(dtype_, shape_)));
  return *array_;
}

Variable Variable::to_abstract() const {
  Variable v(kind_, shape_, dtype_, sharding_, std::nullopt, partitioning_);
  v.metadata_ = metadata_;
  return v;
}

std::string Variable::to_string() const {
  std::string placed = sharding_ ? sharding_->spec().to_string() : "unplaced";
  return fmt::format("{} {} {}{}", kind_, type_string(dtype_, shape_), placed, array_ ? "" : " (abstract)");
}

}  // namespace tessel
