#include "tessel/detail/text_util.h"

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel::text_util {

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024 && bytes > -1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  int unit = -1;
  while ((v >= 1024 || v <= -1024) && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.2f} {}", v, kUnits[unit]);
}

std::vector<std::pair<std::string, std::string>> parse_assignments(std::string_view text, std::string_view flag,
                                                                   std::string_view form) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string_view entry : split_commas(text)) {
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0)
      throw ValueError(fmt::format("{} entry '{}' is not {}", flag, entry, form));
    out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return out;
}

std::string group_digits(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -static_cast<uint64_t>(n) : static_cast<uint64_t>(n));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace tessel::text_util
