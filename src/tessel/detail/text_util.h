// Internal (not installed): small text helpers: comma lists ("16,8", "data=2,fsdp=4"), numbers,
// message prefixes naming the thing an error is about, byte counts for people.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

namespace tessel::text_util {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Items between separators, untrimmed; "a//b" keeps the empty middle item.
inline std::vector<std::string_view> split(std::string_view s, char separator) {
  std::vector<std::string_view> items;
  size_t pos = 0;
  while (true) {
    size_t at = s.find(separator, pos);
    items.push_back(s.substr(pos, at == s.npos ? s.npos : at - pos));
    if (at == s.npos) return items;
    pos = at + 1;
  }
}

// Items between commas, each trimmed; "a,,b" keeps the empty middle item for the caller to name.
inline std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> items = split(s, ',');
  for (auto& item : items) item = trim(item);
  return items;
}

// The whole of `text` as a number ("12", "+1.5", "1e-6"); nullopt for anything else, and for a
// floating-point value that is not finite.
template <class T>
std::optional<T> parse_number(std::string_view text) {
  if (text.size() > 1 && text.front() == '+') text.remove_prefix(1);
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(v)) return std::nullopt;
  }
  return v;
}

// "params/w: " for a non-empty `what` (a parameter path, a flag), "" otherwise.
inline std::string what_prefix(std::string_view what) {
  return what.empty() ? std::string() : std::string(what) + ": ";
}

// "512 B", "4.00 KiB", "1.50 GiB".
std::string format_bytes(int64_t bytes);
// 70553706496 -> "70,553,706,496".
std::string group_digits(int64_t n);

// "a=b, c=" as (name, value) pairs in order; values may be empty. Throws ValueError naming `flag`
// and the entry for one without '=' or with an empty name.
std::vector<std::pair<std::string, std::string>> parse_assignments(std::string_view text, std::string_view flag,
                                                                   std::string_view form);

}  // namespace tessel::text_util
