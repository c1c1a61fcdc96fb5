#include "tessel/core/location.h"

#include <cctype>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/core/path.h"

namespace tessel {
namespace {

[[noreturn]] void refuse(std::string_view text, std::string_view what, const std::string& why) {
  throw ValueError(fmt::format("{}'{}' {}", what.empty() ? std::string() : std::string(what) + ": ", text, why));
}

// S3's and GCS's common rules: 3 to 222 characters of lowercase letters, digits, '.', '-' and
// '_' (S3 itself refuses '_' and more than 63; its server says so), starting and ending with a
// letter or digit.
std::string bucket_problem(std::string_view b) {
  if (b.empty()) return "has no bucket name";
  if (b.size() < 3 || b.size() > 222) return fmt::format("has a bucket name of {} characters (3 to 222)", b.size());
  for (char c : b) {
    const bool ok = std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) return fmt::format("has a bucket name with '{}' (lowercase letters, digits, '.', '-' and '_' only)", c);
  }
  if (!std::isalnum(static_cast<unsigned char>(b.front())) || !std::isalnum(static_cast<unsigned char>(b.back())))
    return "has a bucket name that does not start and end with a letter or digit";
  return {};
}

// The problem with a '/'-separated key (or "" when there is none): no component empty, "." or
// "..", no control characters. A trailing '/' is allowed (a "directory").
std::string key_problem(std::string_view key) {
  size_t start = 0;
  while (start < key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    const std::string_view part = key.substr(start, end - start);
    if (part.empty()) return "has an empty name in its key ('//')";
    if (part == "." || part == "..") return fmt::format("has '{}' in its key", part);
    for (char c : part) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "has a control character in its key";
    }
    start = end + 1;
  }
  return {};
}

}  // namespace

Location Location::parse(std::string_view text, std::string_view what) {
  const std::string scheme = url_scheme(text);
  if (scheme != "s3" && scheme != "gs") {
    if (scheme != "" && scheme != "file") {
      refuse(text, what,
             fmt::format("is a {}:// URL: checkpoints are local paths, file:///path, s3://bucket/key or gs://bucket/key",
                         scheme));
    }
    return Location(Local{}, local_path(text, what));
  }
  std::string_view rest = text.substr(scheme.size() + 3);
  const size_t slash = rest.find('/');
  Location loc;
  loc.kind_ = scheme == "s3" ? Kind::kS3 : Kind::kGcs;
  loc.bucket_ = std::string(rest.substr(0, slash));
  if (const std::string p = bucket_problem(loc.bucket_); !p.empty()) refuse(text, what, p);
  std::string_view key = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  if (key.find_first_of("?#") != std::string_view::npos)
    refuse(text, what, "has a query or fragment ('?' or '#'): give the bucket and key alone");
  while (key.ends_with('/')) key.remove_suffix(1);
  if (const std::string p = key_problem(key); !p.empty()) refuse(text, what, p);
  loc.key_ = std::string(key);
  return loc;
}

const std::filesystem::path& Location::local(std::string_view what) const {
  if (!is_local()) {
    throw ValueError(fmt::format("{}'{}' is in a bucket; this needs a local path",
                                 what.empty() ? std::string() : std::string(what) + ": ", string()));
  }
  return path_;
}

std::string_view Location::scheme() const {
  switch (kind_) {
    case Kind::kS3:
      return "s3";
    case Kind::kGcs:
      return "gs";
    case Kind::kLocal:
      break;
  }
  return "";
}

Location Location::operator/(std::string_view relative) const {
  if (is_local()) return Location(Local{}, path_ / relative);
  while (relative.ends_with('/')) relative.remove_suffix(1);
  if (const std::string p = key_problem(relative); !p.empty() || relative.empty()) {
    throw ValueError(fmt::format("'{}' below '{}' {}", relative, string(), p.empty() ? "is empty" : p));
  }
  Location out = *this;
  out.key_ = key_.empty() ? std::string(relative) : key_ + "/" + std::string(relative);
  return out;
}

std::string Location::filename() const {
  if (is_local()) {
    const std::filesystem::path n = path_.lexically_normal();
    return (n.has_filename() ? n.filename() : n.parent_path().filename()).string();
  }
  const size_t slash = key_.rfind('/');
  return slash == std::string::npos ? key_ : key_.substr(slash + 1);
}

Location Location::parent() const {
  if (is_local()) {
    const std::filesystem::path n = path_.lexically_normal();
    return Location(Local{}, n.has_filename() ? n.parent_path() : n.parent_path().parent_path());
  }
  Location out = *this;
  const size_t slash = key_.rfind('/');
  out.key_ = slash == std::string::npos ? std::string() : key_.substr(0, slash);
  return out;
}

std::string Location::string() const {
  if (is_local()) return path_.string();
  return fmt::format("{}://{}{}{}", scheme(), bucket_, key_.empty() ? "" : "/", key_);
}

}  // namespace tessel
