#include "tessel/runtime/inspect.h"

#include <fmt/format.h>

#include "tessel/detail/text_util.h"
#include "tessel/runtime/device.h"
#include "tessel/sharding/visualize.h"

namespace tessel {

std::string visualize(const Array& array) {
  std::string head = array.type_string();
  if (!array.label().empty()) head += " " + array.label();
  return fmt::format("{}: {}\n{}", head, array.sharding().to_string(),
                     visualize(array.sharding(), array.shape()));
}

std::string memory_table(const Runtime& rt) {
  using text_util::format_bytes;
  std::string out = fmt::format("{:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>7}  {}\n", "device",
                                "in use", "peak", "cached", "limit", "buffers", "held by");
  for (int64_t id = 0; id < rt.device_count(); ++id) {
    const Device& d = rt.device(id);
    MemoryStats m = d.memory_stats();
    std::string holders;
    auto list = d.memory_holders();
    for (size_t i = 0; i < list.size() && i < 3; ++i)
      holders += fmt::format("{}{} {}", i ? ", " : "", list[i].label, format_bytes(list[i].bytes));
    if (list.size() > 3) holders += fmt::format(", +{} more", list.size() - 3);
    out += fmt::format("{:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>7}  {}\n", id,
                       format_bytes(m.in_use), format_bytes(m.peak), format_bytes(m.cached),
                       m.limit ? format_bytes(*m.limit) : "none", m.buffers,
                       holders.empty() ? "-" : holders);
  }
  return out;
}

}  // namespace tessel
