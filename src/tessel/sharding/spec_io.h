// MaxText's sharding dump formats.
//
// Logical dump (logical_shardings.json): {path: {"partition_spec": [logical name or null, ...],
// "shape": [...]}}. Named dump (named_shardings.json): {path: {"mesh": {"axis_names": [...],
// "shape": {axis: size}}, "partition_spec": [...JAX-normalized...], "shape": [...]}}.
//
//   auto entries = tessel::load_logical_dump("logical_shardings.json");
//   for (auto& e : entries) named.push_back({e.path, rules.resolve(e.axes, mesh, {}, e.shape, e.path), e.shape});
//   std::cout << tessel::named_dump_json(named, mesh);
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/shape.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel {

struct LogicalEntry {
  std::string path;
  LogicalAxes axes;
  Shape shape;
};

struct NamedEntry {
  std::string path;
  PartitionSpec spec;
  Shape shape;
};

// Entries in file order. Throws ParseError naming the file and the path of a bad entry.
std::vector<LogicalEntry> parse_logical_dump(std::string_view text, std::string source = "<json>");
std::vector<LogicalEntry> load_logical_dump(const std::filesystem::path& file);

// MaxText's named_shardings.json text (2-space indent), every entry on `mesh`.
std::string named_dump_json(const std::vector<NamedEntry>& entries, const Mesh& mesh);
// Reads a named dump back; each entry's mesh is returned beside it.
struct NamedDumpEntry {
  NamedEntry entry;
  Mesh mesh;
};
std::vector<NamedDumpEntry> parse_named_dump(std::string_view text, std::string source = "<json>");

}  // namespace tessel
