// Reading logical axis rules from MaxText's YAML format (a whole MaxText config works: only
// `logical_axis_rules` and `mesh_axes` are read) or from the same structure in JSON.
//
//   logical_axis_rules: [['mlp', ['fsdp_transpose', 'tensor']], ['embed', 'fsdp'], ['kv', []]]
//   mesh_axes: ['data', 'fsdp', 'tensor']          # optional
//
//   auto rules = tessel::load_rules("base.yml");   // .json files are read as JSON
//
// A bare list of [name, axes] pairs is accepted too. Errors are ParseError with file and line.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "tessel/sharding/logical_rules.h"

namespace tessel {

LogicalRules load_rules(const std::filesystem::path& file);
LogicalRules parse_rules_yaml(std::string_view text, std::string source = "<yaml>");
LogicalRules parse_rules_json(std::string_view text, std::string source = "<json>");

}  // namespace tessel
