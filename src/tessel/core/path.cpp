#include "tessel/core/path.h"

#include <cctype>

#include <fmt/format.h>

#include "tessel/core/error.h"

namespace tessel {
namespace {

bool scheme_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
}

[[noreturn]] void refuse(std::string_view text, std::string_view what, const std::string& why) {
  throw ValueError(fmt::format("{}'{}' {}", what.empty() ? std::string() : std::string(what) + ": ", text, why));
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string url_scheme(std::string_view text) {
  const size_t colon = text.find("://");
  if (colon == std::string_view::npos || colon == 0) return {};
  if (!std::isalpha(static_cast<unsigned char>(text[0]))) return {};
  std::string scheme;
  for (size_t i = 0; i < colon; ++i) {
    if (!scheme_char(text[i])) return {};
    scheme += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  return scheme;
}

std::filesystem::path local_path(std::string_view text, std::string_view what) {
  const std::string scheme = url_scheme(text);
  if (scheme.empty()) return std::filesystem::path(text);
  if (scheme != "file") {
    refuse(text, what,
           fmt::format("is a URL ({}://): object stores and remote URLs are not supported yet (give a local path; "
                       "nothing was written)",
                       scheme));
  }
  // RFC 8089: file://<host>/<path>, where an empty host or "localhost" is this machine.
  std::string_view rest = text.substr(scheme.size() + 3);
  const size_t slash = rest.find('/');
  const std::string_view host = rest.substr(0, slash);
  if (slash == std::string_view::npos || (!host.empty() && host != "localhost")) {
    refuse(text, what, fmt::format("is a file URL on host '{}': remote files are not supported yet (give a local path, or "
                                   "file:///path on this machine; nothing was written)",
                                   host));
  }
  rest.remove_prefix(slash);
  if (rest.find_first_of("?#") != std::string_view::npos) {
    refuse(text, what, "is a file URL with a query or fragment ('?' or '#'): give the path alone");
  }
  std::string decoded;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] != '%') {
      decoded += rest[i];
      continue;
    }
    const int hi = i + 2 < rest.size() ? hex_value(rest[i + 1]) : -1;
    const int lo = i + 2 < rest.size() ? hex_value(rest[i + 2]) : -1;
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
      refuse(text, what, fmt::format("has a bad percent escape at byte {}", scheme.size() + 3 + slash + i));
    }
    decoded += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return std::filesystem::path(decoded);
}

}  // namespace tessel
