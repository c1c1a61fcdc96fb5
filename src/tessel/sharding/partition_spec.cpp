#include "tessel/sharding/partition_spec.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/sharding/detail/spec_json.h"
#include "tessel/sharding/mesh.h"

namespace tessel {
PartitionSpec::PartitionSpec(std::vector<DimSharding> dims) : dims_(std::move(dims)) {
  std::vector<std::string_view> seen;
  for (size_t d = 0; d < dims_.size(); ++d) {
    for (const std::string& axis : dims_[d]) {
      if (axis.empty())
        throw ValueError(fmt::format("partition spec dimension {} names an empty mesh axis", d));
      if (std::find(seen.begin(), seen.end(), axis) != seen.end())
        throw ValueError(fmt::format(
            "partition spec uses mesh axis '{}' twice (again in dimension {}); an axis can split "
            "only one dimension once",
            axis, d));
      seen.push_back(axis);
    }
  }
}

PartitionSpec PartitionSpec::from_json(std::string_view text, std::string_view source) {
  nlohmann::json j = json_util::parse(text, source);
  return spec_json::from_json(j, source);
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> out;
  for (const auto& d : dims_) out.insert(out.end(), d.begin(), d.end());
  return out;
}

void PartitionSpec::validate(const Mesh& mesh, size_t rank, std::string_view what) const {
  if (dims_.size() > rank)
    throw ValueError(fmt::format("{}partition spec {} has {} entries but the array has rank {}",
                                 text_util::what_prefix(what), to_string(), dims_.size(), rank));
  for (size_t d = 0; d < dims_.size(); ++d)
    for (const std::string& axis : dims_[d])
      if (!mesh.has_axis(axis))
        throw ValueError(fmt::format("{}partition spec {} dimension {} uses mesh axis '{}', which "
                                     "{} does not have (axes: {})",
                                     text_util::what_prefix(what), to_string(), d, axis, mesh.to_string(),
                                     fmt::join(mesh.axis_names(), ", ")));
}

std::string PartitionSpec::to_string() const {
  std::string out = "PartitionSpec(";
  for (size_t d = 0; d < dims_.size(); ++d) {
    if (d) out += ", ";
    const DimSharding& axes = dims_[d];
    if (axes.empty()) {
      out += "None";
    } else if (axes.size() == 1) {
      out += fmt::format("'{}'", axes[0]);
    } else {
      out += "(";
      for (size_t i = 0; i < axes.size(); ++i) out += fmt::format("{}'{}'", i ? ", " : "", axes[i]);
      out += ")";
    }
  }
  return out + ")";
}

std::string PartitionSpec::to_json() const { return spec_json::to_json(*this).dump(); }

}  // namespace tessel
