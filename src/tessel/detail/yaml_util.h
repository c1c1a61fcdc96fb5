// Internal (not installed): YAML loading with errors as ParseError carrying file, line, column.
#pragma once

#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

namespace tessel::yaml_util {

// Parses `text`; invalid YAML throws ParseError("invalid YAML: ...") at the reported position.
YAML::Node load(std::string_view text, const std::string& source);

// Throws ParseError at `at`'s position (0:0 when the node has none).
[[noreturn]] void fail(const std::string& source, const YAML::Node& at, const std::string& message);

}  // namespace tessel::yaml_util
