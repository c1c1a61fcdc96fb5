#include "tessel/detail/json_util.h"

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel::json_util {

Json parse(std::string_view text, std::string_view source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann reports a byte offset (1-based, one past the offending byte); give line/column.
    size_t byte = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < byte; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " lead.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    throw ParseError(std::string(source), line, column, "invalid JSON: " + what);
  } catch (const nlohmann::json::exception& e) {
    // Not a syntax error but a value JSON allows and nlohmann cannot hold (a number out of range).
    std::string what = e.what();
    if (auto close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw ParseError(std::string(source), 0, 0, "unsupported JSON: " + what);
  }
}

std::string kind(const Json& j) { return j.type_name(); }

std::string dump(const Json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tessel::json_util
