#include "tessel/state/state.h"

#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string join_descriptions(const std::vector<Filter>& filters, std::string_view op) {
  std::string out = "(";
  for (size_t i = 0; i < filters.size(); ++i) out += (i ? std::string(op) : "") + filters[i].description();
  return out + ")";
}

}  // namespace

bool PathLess::operator()(std::string_view a, std::string_view b) const {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && is_digit(a[ie])) ++ie;
      while (je < b.size() && is_digit(b[je])) ++je;
      // Compare digit runs as numbers: strip leading zeros, then by length, then by digits.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      std::string_view da = a.substr(is, ie - is), db = b.substr(js, je - js);
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      if (ie - i != je - j) return ie - i < je - j;  // "01" after "1": keep the order strict
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) {
      // '/' sorts first so "a/b" precedes "a_b" and every child of "a" stays together.
      if (a[i] == '/') return true;
      if (b[j] == '/') return false;
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    }
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

Filter::Filter(Predicate predicate, std::string description)
    : predicate_(std::move(predicate)), description_(std::move(description)) {}

Filter Filter::all() { return Filter([](const std::string&, const Variable&) { return true; }, "..."); }
Filter Filter::none() { return Filter([](const std::string&, const Variable&) { return false; }, "nothing"); }

Filter Filter::kind(std::string kind) {
  std::string d = "kind(" + kind + ")";
  return Filter([k = std::move(kind)](const std::string&, const Variable& v) { return v.kind() == k; }, d);
}

Filter Filter::path_contains(std::string text) {
  std::string d = "path contains '" + text + "'";
  return Filter([t = std::move(text)](const std::string& p, const Variable&) {
    return p.find(t) != std::string::npos;
  }, d);
}

Filter Filter::path_regex(const std::string& pattern) {
  std::shared_ptr<const std::regex> re;
  try {
    re = std::make_shared<const std::regex>(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ValueError(fmt::format("invalid path regex '{}': {}", pattern, e.what()));
  }
  return Filter([re](const std::string& p, const Variable&) { return std::regex_search(p, *re); },
                "path ~ /" + pattern + "/");
}

Filter Filter::any_of(std::vector<Filter> filters) {
  std::string d = join_descriptions(filters, " | ");
  return Filter([fs = std::move(filters)](const std::string& p, const Variable& v) {
    for (const Filter& f : fs)
      if (f(p, v)) return true;
    return false;
  }, d);
}

Filter Filter::all_of(std::vector<Filter> filters) {
  std::string d = join_descriptions(filters, " & ");
  return Filter([fs = std::move(filters)](const std::string& p, const Variable& v) {
    for (const Filter& f : fs)
      if (!f(p, v)) return false;
    return true;
  }, d);
}

Filter Filter::negate(Filter filter) {
  std::string d = "!" + filter.description();
  return Filter([f = std::move(filter)](const std::string& p, const Variable& v) { return !f(p, v); }, d);
}

void State::insert(std::string path, Variable variable) {
  if (path.empty() || path.front() == '/' || path.back() == '/' || path.find("//") != std::string::npos)
    throw ValueError(fmt::format("invalid variable path '{}': segments must be non-empty, joined by '/'", path));
  if (contains(path)) throw ValueError(fmt::format("variable path '{}' is defined twice", path));
  vars_.emplace(std::move(path), std::move(variable));
}

void State::replace(const std::string& path, Variable variable) {
  auto it = vars_.find(path);
  if (it == vars_.end()) throw ValueError(fmt::format("no variable '{}' to replace", path));
  it->second = std::move(variable);
}

const Variable& State::at(std::string_view path) const {
  auto it = vars_.find(path);
  if (it != vars_.end()) return it->second;
  // Name a few neighbours: usually the typo is in the last segment.
  std::vector<std::string> near;
  auto lo = vars_.lower_bound(path);
  for (auto i = lo; i != vars_.end() && near.size() < 3; ++i) near.push_back(i->first);
  throw ValueError(fmt::format("no variable '{}' in the state ({} variables{}{})", path, vars_.size(),
                               near.empty() ? "" : "; next: ", fmt::format("{}", fmt::join(near, ", "))));
}

std::vector<std::string> State::paths() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [p, v] : vars_) out.push_back(p);
  return out;
}

State State::filter(const Filter& filter) const {
  State out;
  for (const auto& [p, v] : vars_)
    if (filter(p, v)) out.vars_.emplace(p, v);
  return out;
}

std::vector<State> State::split(const std::vector<Filter>& filters) const {
  std::vector<State> parts(filters.size());
  for (const auto& [p, v] : vars_) {
    size_t k = 0;
    while (k < filters.size() && !filters[k](p, v)) ++k;
    if (k == filters.size())
      throw ValueError(fmt::format("split: variable '{}' ({}) matches none of the filters {}; pass "
                                   "Filter::all() last to collect the rest",
                                   p, v.kind(), join_descriptions(filters, ", ")));
    parts[k].vars_.emplace(p, v);
  }
  return parts;
}

State State::merge(const std::vector<State>& parts) {
  State out;
  for (const State& part : parts)
    for (const auto& [p, v] : part.vars_)
      if (!out.vars_.emplace(p, v).second)
        throw ValueError(fmt::format("merge: variable '{}' is in more than one state", p));
  return out;
}

int64_t State::nbytes() const {
  int64_t total = 0;
  for (const auto& [p, v] : vars_)
    if (__builtin_add_overflow(total, v.nbytes(), &total))
      throw ValueError("the state's variables hold more than 2^63 bytes in all");
  return total;
}

State State::to_abstract() const {
  State out;
  for (const auto& [p, v] : vars_) out.vars_.emplace(p, v.to_abstract());
  return out;
}

std::string State::to_string() const {
  std::string out;
  for (const auto& [p, v] : vars_) out += fmt::format("{}: {}\n", p, v.to_string());
  return out;
}

}  // namespace tessel
