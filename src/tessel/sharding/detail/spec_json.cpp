#include "tessel/sharding/detail/spec_json.h"

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel::spec_json {

PartitionSpec from_json(const Json& j, std::string_view what) {
  if (!j.is_array())
    throw ValueError(fmt::format("{}: partition spec must be a JSON array, got {}", what, json_util::kind(j)));
  std::vector<DimSharding> dims;
  for (size_t d = 0; d < j.size(); ++d) {
    const Json& e = j[d];
    DimSharding axes;
    if (e.is_string()) {
      axes.push_back(e.get<std::string>());
    } else if (e.is_array()) {
      for (const Json& a : e) {
        if (!a.is_string())
          throw ValueError(fmt::format("{}: partition spec dimension {} lists a {}, not a mesh axis name",
                                       what, d, json_util::kind(a)));
        axes.push_back(a.get<std::string>());
      }
    } else if (!e.is_null()) {
      throw ValueError(fmt::format(
          "{}: partition spec dimension {} is a {}; expected null, an axis name or a list of them",
          what, d, json_util::kind(e)));
    }
    dims.push_back(std::move(axes));
  }
  try {
    return PartitionSpec(std::move(dims));
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", what, e.what()));
  }
}

Json to_json(const PartitionSpec& spec) {
  Json out = Json::array();
  for (const DimSharding& axes : spec.dims()) {
    if (axes.empty())
      out.push_back(nullptr);
    else if (axes.size() == 1)
      out.push_back(axes[0]);
    else
      out.push_back(axes);
  }
  return out;
}

}  // namespace tessel::spec_json
