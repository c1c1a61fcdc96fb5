#include "tessel/runtime/process_group.h"

#include <exception>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

std::string shorten(const std::string& s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; }

}  // namespace

std::vector<std::string> gather_together(ProcessGroup& group, std::string_view what,
                                         const std::function<std::string()>& fn) {
  // Each process sends 'ok' + its result or 'failed' + its message; all decide alike.
  std::exception_ptr error;
  std::string mine;
  try {
    mine = "+" + fn();
  } catch (const std::exception& e) {
    error = std::current_exception();
    mine = "-" + std::string(e.what());
  }
  std::vector<std::string> all = group.all_gather(mine, what);
  for (size_t p = 0; p < all.size(); ++p) {
    if (!all[p].empty() && all[p][0] == '+') continue;
    if (error) std::rethrow_exception(error);
    const std::string message = all[p].empty() ? "(no message)" : all[p].substr(1);
    throw Error(fmt::format("{} failed on process {}: {}", what, p, shorten(message)));
  }
  for (std::string& s : all) s.erase(0, 1);
  return all;
}

void run_together(ProcessGroup& group, std::string_view what, const std::function<void()>& fn) {
  gather_together(group, what, [&] {
    fn();
    return std::string();
  });
}

void check_same(ProcessGroup& group, const std::string& text, std::string_view what) {
  const std::vector<std::string> all = group.all_gather(text, what);
  for (size_t p = 1; p < all.size(); ++p) {
    if (all[p] == all[0]) continue;
    throw ValueError(fmt::format("the {} differs between processes: process 0 has '{}', process {} has '{}'", what,
                                 shorten(all[0]), p, shorten(all[p])));
  }
}

}  // namespace tessel
