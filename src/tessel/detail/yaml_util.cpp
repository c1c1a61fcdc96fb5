#include "tessel/detail/yaml_util.h"

#include "tessel/core/error.h"

namespace tessel::yaml_util {

YAML::Node load(std::string_view text, const std::string& source) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw ParseError(source, 0, 0, "invalid YAML: " + e.msg);
    throw ParseError(source, e.mark.line + 1, e.mark.column + 1, "invalid YAML: " + e.msg);
  }
}

void fail(const std::string& source, const YAML::Node& at, const std::string& message) {
  // A missing node (a key that is not there) has no position, and asking for one throws.
  const YAML::Mark m = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
  if (m.is_null()) throw ParseError(source, 0, 0, message);
  throw ParseError(source, m.line + 1, m.column + 1, message);
}

}  // namespace tessel::yaml_util
