#include "tessel/core/error.h"

#include <fmt/format.h>

namespace tessel {
namespace {

std::string locate(const std::string& source, int64_t line, int64_t column) {
  if (line <= 0) return source;
  if (column <= 0) return fmt::format("{}:{}", source, line);
  return fmt::format("{}:{}:{}", source, line, column);
}

}  // namespace

ParseError::ParseError(std::string source, int64_t line, int64_t column,
                       const std::string& message)
    : Error(fmt::format("{}: {}", locate(source, line, column), message)),
      source_(std::move(source)),
      line_(line),
      column_(column) {}

}  // namespace tessel
