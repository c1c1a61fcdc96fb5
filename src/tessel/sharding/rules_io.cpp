#include "tessel/sharding/rules_io.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/yaml_util.h"

namespace tessel {
namespace {

// ---- YAML ----

using yaml_util::fail;

std::string yaml_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "scalar";
    case YAML::NodeType::Sequence: return "list";
    case YAML::NodeType::Map: return "map";
    default: return "undefined value";
  }
}

std::vector<std::string> yaml_axes(const std::string& source, const YAML::Node& n, size_t entry) {
  std::vector<std::string> axes;
  if (n.IsNull()) return axes;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence())
    fail(source, n, fmt::format("logical_axis_rules entry {}: mesh axes must be an axis name, "
                                     "a list of axis names or [], got a {}", entry, yaml_kind(n)));
  for (const YAML::Node& a : n) {
    if (!a.IsScalar())
      fail(source, a, fmt::format("logical_axis_rules entry {}: mesh axis must be a name, got a {}",
                                       entry, yaml_kind(a)));
    axes.push_back(a.Scalar());
  }
  return axes;
}

// The rules list: the root itself, or its logical_axis_rules. (yaml-cpp's Node::operator= rebinds
// the node it refers to, so nodes are only ever constructed here, never assigned.)
YAML::Node yaml_rules_list(const YAML::Node& root, const std::string& source) {
  if (!root.IsMap()) return root;
  YAML::Node list = root["logical_axis_rules"];
  if (!list)
    fail(source, root, "no 'logical_axis_rules' key; expected MaxText's format "
                            "logical_axis_rules: [[name, [mesh axes]], ...]");
  return list;
}

std::vector<std::string> yaml_mesh_axes(const YAML::Node& root, const std::string& source) {
  std::vector<std::string> mesh_axes;
  if (!root.IsMap()) return mesh_axes;
  const YAML::Node m = root["mesh_axes"];
  if (!m || m.IsNull()) return mesh_axes;
  if (!m.IsSequence())
    fail(source, m, fmt::format("mesh_axes must be a list of axis names, got a {}", yaml_kind(m)));
  for (const YAML::Node& a : m) {
    if (!a.IsScalar())
      fail(source, a, fmt::format("mesh_axes entries must be axis names, got a {}", yaml_kind(a)));
    mesh_axes.push_back(a.Scalar());
  }
  return mesh_axes;
}

LogicalRules rules_from_yaml(const YAML::Node& root, const std::string& source) {
  const YAML::Node list = yaml_rules_list(root, source);
  std::vector<std::string> mesh_axes = yaml_mesh_axes(root, source);
  if (!list.IsSequence())
    fail(source, list, fmt::format("logical_axis_rules must be a list of [name, mesh axes] pairs, got a {}",
                                        yaml_kind(list)));
  std::vector<LogicalRule> rules;
  size_t entry = 0;
  for (const YAML::Node& e : list) {
    if (!e.IsSequence() || e.size() != 2)
      fail(source, e, fmt::format("logical_axis_rules entry {} must be a [logical_name, mesh_axes] "
                                       "pair, got a {}{}", entry, yaml_kind(e),
                                       e.IsSequence() ? fmt::format(" of {} items", e.size()) : ""));
    if (!e[0].IsScalar())
      fail(source, e[0], fmt::format("logical_axis_rules entry {}: logical name must be a string, got a {}",
                                          entry, yaml_kind(e[0])));
    LogicalRule rule{e[0].Scalar(), yaml_axes(source, e[1], entry), e.Mark().line + 1};
    rules.push_back(std::move(rule));
    ++entry;
  }
  return LogicalRules(std::move(rules), std::move(mesh_axes), source);
}

// ---- JSON ----

using json_util::Json;

std::vector<std::string> json_axes(const std::string& source, const Json& j, size_t entry) {
  std::vector<std::string> axes;
  if (j.is_null()) return axes;
  if (j.is_string()) return {j.get<std::string>()};
  if (!j.is_array())
    throw ParseError(source, 0, 0, fmt::format("logical_axis_rules[{}]: mesh axes must be an axis name, a "
                                               "list of axis names or [], got {}", entry, json_util::kind(j)));
  for (const Json& a : j) {
    if (!a.is_string())
      throw ParseError(source, 0, 0, fmt::format("logical_axis_rules[{}]: mesh axis must be a string, got {}",
                                                 entry, json_util::kind(a)));
    axes.push_back(a.get<std::string>());
  }
  return axes;
}

LogicalRules rules_from_json(const Json& root, const std::string& source) {
  const Json* list = &root;
  std::vector<std::string> mesh_axes;
  if (root.is_object()) {
    auto it = root.find("logical_axis_rules");
    if (it == root.end())
      throw ParseError(source, 0, 0, "no \"logical_axis_rules\" key; expected {\"logical_axis_rules\": "
                                     "[[name, [mesh axes]], ...]}");
    list = &*it;
    if (auto m = root.find("mesh_axes"); m != root.end() && !m->is_null()) {
      if (!m->is_array())
        throw ParseError(source, 0, 0, fmt::format("mesh_axes must be a list of axis names, got {}",
                                                   json_util::kind(*m)));
      for (const Json& a : *m) {
        if (!a.is_string())
          throw ParseError(source, 0, 0, fmt::format("mesh_axes entries must be strings, got {}",
                                                     json_util::kind(a)));
        mesh_axes.push_back(a.get<std::string>());
      }
    }
  }
  if (!list->is_array())
    throw ParseError(source, 0, 0, fmt::format("logical_axis_rules must be a list of [name, mesh axes] pairs, "
                                               "got {}", json_util::kind(*list)));
  std::vector<LogicalRule> rules;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& e = (*list)[i];
    if (!e.is_array() || e.size() != 2)
      throw ParseError(source, 0, 0, fmt::format("logical_axis_rules[{}] must be a [logical_name, mesh_axes] "
                                                 "pair, got {}", i, e.is_array() ? fmt::format("an array of {} items", e.size())
                                                                                : json_util::kind(e)));
    if (!e[0].is_string())
      throw ParseError(source, 0, 0, fmt::format("logical_axis_rules[{}]: logical name must be a string, got {}",
                                                 i, json_util::kind(e[0])));
    rules.push_back({e[0].get<std::string>(), json_axes(source, e[1], i), 0});
  }
  return LogicalRules(std::move(rules), std::move(mesh_axes), source);
}

}  // namespace

LogicalRules parse_rules_yaml(std::string_view text, std::string source) {
  YAML::Node root = yaml_util::load(text, source);
  try {
    return rules_from_yaml(root, source);
  } catch (const YAML::Exception& e) {  // conversions inside yaml-cpp; should not happen
    throw ParseError(source, e.mark.is_null() ? 0 : e.mark.line + 1, 0, "invalid rules: " + e.msg);
  }
}

LogicalRules parse_rules_json(std::string_view text, std::string source) {
  return rules_from_json(json_util::parse(text, source), source);
}

LogicalRules load_rules(const std::filesystem::path& file) {
  std::string text = file_util::read_text(file);
  std::string source = file.string();
  if (file.extension() == ".json") return parse_rules_json(text, source);
  return parse_rules_yaml(text, source);
}

}  // namespace tessel
