#include "tessel/detail/text_util.h"

#include <fmt/format.h>

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

}  // namespace tessel::text_util
