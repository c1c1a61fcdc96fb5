#include "tessel/sharding/spec_io.h"

#include <optional>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/sharding/detail/spec_json.h"

namespace tessel {
namespace {

using json_util::Json;

[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& msg) {
  throw ParseError(source, 0, 0, fmt::format("entry '{}': {}", path, msg));
}

const Json& member(const std::string& source, const std::string& path, const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(source, path, fmt::format("missing \"{}\"", key));
  return *it;
}

Shape shape_from_json(const std::string& source, const std::string& path, const Json& j) {
  if (!j.is_array()) fail(source, path, fmt::format("\"shape\" must be an array, got {}", json_util::kind(j)));
  std::vector<int64_t> dims;
  for (size_t d = 0; d < j.size(); ++d) {
    const Json& v = j[d];
    if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() > INT64_MAX : v.get<int64_t>() < 0))
      fail(source, path, fmt::format("\"shape\" dimension {} is {}, not a non-negative integer", d,
                                     json_util::dump(v)));
    dims.push_back(v.get<int64_t>());
  }
  return Shape(std::move(dims));
}

Json checked_root(std::string_view text, const std::string& source) {
  Json root = json_util::parse(text, source);
  if (!root.is_object())
    throw ParseError(source, 0, 0, fmt::format("expected a JSON object mapping paths to entries, got {}",
                                               json_util::kind(root)));
  return root;
}

}  // namespace

std::vector<LogicalEntry> parse_logical_dump(std::string_view text, std::string source) {
  Json root = checked_root(text, source);
  std::vector<LogicalEntry> out;
  for (const auto& [path, value] : root.items()) {
    if (!value.is_object()) fail(source, path, fmt::format("expected an object, got {}", json_util::kind(value)));
    const Json& spec = member(source, path, value, "partition_spec");
    if (!spec.is_array())
      fail(source, path, fmt::format("\"partition_spec\" must be an array, got {}", json_util::kind(spec)));
    LogicalEntry entry{path, {}, shape_from_json(source, path, member(source, path, value, "shape"))};
    for (size_t d = 0; d < spec.size(); ++d) {
      if (spec[d].is_null())
        entry.axes.push_back(std::nullopt);
      else if (spec[d].is_string())
        entry.axes.push_back(spec[d].get<std::string>());
      else
        fail(source, path, fmt::format("\"partition_spec\" dimension {} is {}; a logical spec holds one "
                                       "logical name or null per dimension", d, json_util::dump(spec[d])));
    }
    if (entry.axes.size() != entry.shape.rank())
      fail(source, path, fmt::format("\"partition_spec\" has {} entries but \"shape\" {} has rank {}",
                                     entry.axes.size(), entry.shape.to_string(), entry.shape.rank()));
    out.push_back(std::move(entry));
  }
  return out;
}

std::vector<LogicalEntry> load_logical_dump(const std::filesystem::path& file) {
  return parse_logical_dump(file_util::read_text(file), file.string());
}

std::string named_dump_json(const std::vector<NamedEntry>& entries, const Mesh& mesh) {
  Json mesh_json = Json::object();
  mesh_json["axis_names"] = mesh.axis_names();
  Json sizes = Json::object();
  for (const MeshAxis& a : mesh.axes()) sizes[a.name] = a.size;
  mesh_json["shape"] = std::move(sizes);
  Json root = Json::object();
  for (const NamedEntry& e : entries) {
    Json entry = Json::object();
    entry["mesh"] = mesh_json;
    entry["partition_spec"] = spec_json::to_json(e.spec);
    entry["shape"] = e.shape.dims();
    root[e.path] = std::move(entry);
  }
  return json_util::dump(root, 2) + "\n";
}

std::vector<NamedDumpEntry> parse_named_dump(std::string_view text, std::string source) {
  Json root = checked_root(text, source);
  std::vector<NamedDumpEntry> out;
  for (const auto& [path, value] : root.items()) {
    if (!value.is_object()) fail(source, path, fmt::format("expected an object, got {}", json_util::kind(value)));
    NamedEntry entry;
    entry.path = path;
    entry.shape = shape_from_json(source, path, member(source, path, value, "shape"));
    try {
      entry.spec = spec_json::from_json(member(source, path, value, "partition_spec"), "partition_spec");
    } catch (const ValueError& err) {
      fail(source, path, err.what());
    }
    const Json& mesh = member(source, path, value, "mesh");
    const Json& names = member(source, path, mesh, "axis_names");
    const Json& sizes = member(source, path, mesh, "shape");
    if (!names.is_array() || !sizes.is_object())
      fail(source, path, "\"mesh\" needs an \"axis_names\" array and a \"shape\" object");
    std::vector<MeshAxis> axes;
    for (const Json& n : names) {
      if (!n.is_string()) fail(source, path, "mesh axis names must be strings");
      auto it = sizes.find(n.get<std::string>());
      if (it == sizes.end() || !it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX))
        fail(source, path, fmt::format("mesh \"shape\" has no integer size for axis '{}'", n.get<std::string>()));
      axes.push_back({n.get<std::string>(), it->get<int64_t>()});
    }
    std::optional<Mesh> parsed;
    try {
      parsed.emplace(std::move(axes));
    } catch (const ValueError& err) {
      fail(source, path, err.what());
    }
    NamedDumpEntry e{std::move(entry), std::move(*parsed)};
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace tessel
