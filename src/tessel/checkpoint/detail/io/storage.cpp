#include "tessel/checkpoint/detail/io/storage.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/object_store.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;
namespace {

// An object read by range requests.
class StoredObject final : public ByteSource {
 public:
  StoredObject(std::shared_ptr<const ObjectStore> client, Location loc, int64_t size)
      : client_(std::move(client)), loc_(std::move(loc)), size_(size) {}
  int64_t size() const override { return size_; }
  std::string where() const override { return loc_.string(); }
  void read_exact(int64_t offset, std::span<std::byte> out) const override {
    const int64_t n = static_cast<int64_t>(out.size());
    if (offset < 0 || offset > size_ || n > size_ - offset) {
      throw IoError(fmt::format("{}: truncated: bytes [{}, {}) asked of an object of {}", where(), offset, offset + n,
                                size_));
    }
    client_->read(loc_.bucket(), loc_.key(), offset, out);
  }

 private:
  std::shared_ptr<const ObjectStore> client_;
  Location loc_;
  int64_t size_;
};

std::string dir_prefix(const Location& loc) { return loc.key().empty() ? std::string() : loc.key() + "/"; }

}  // namespace

void ByteSource::read_scatter(int64_t offset, std::span<const iovec> buffers) const {
  for (const iovec& v : buffers) {
    read_exact(offset, {static_cast<std::byte*>(v.iov_base), v.iov_len});
    offset += static_cast<int64_t>(v.iov_len);
  }
}

bool is_file(const Location& loc) {
  if (loc.is_local()) {
    std::error_code ec;
    return fs::is_regular_file(fs::symlink_status(loc.local(), ec));
  }
  if (loc.key().empty()) return false;
  return ObjectStore::for_location(loc)->head(loc.bucket(), loc.key()).has_value();
}

bool is_directory(const Location& loc) {
  if (loc.is_local()) {
    std::error_code ec;
    return fs::is_directory(fs::symlink_status(loc.local(), ec));
  }
  const ObjectListing l = ObjectStore::for_location(loc)->list(loc.bucket(), dir_prefix(loc), "/", 1);
  return !l.objects.empty() || !l.prefixes.empty();
}

std::vector<StorageEntry> list_directory(const Location& dir) {
  std::vector<StorageEntry> out;
  if (dir.is_local()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir.local(), ec)) {
      if (e.is_symlink()) continue;
      if (e.is_directory()) {
        out.push_back({e.path().filename().string(), true});
      } else if (e.is_regular_file()) {
        out.push_back({e.path().filename().string(), false});
      }
    }
    if (ec) throw IoError("cannot list '" + dir.string() + "': " + ec.message());
  } else {
    const std::string prefix = dir_prefix(dir);
    const ObjectListing l = ObjectStore::for_location(dir)->list(dir.bucket(), prefix, "/");
    for (const std::string& p : l.prefixes) {
      std::string name = p.substr(prefix.size());
      if (name.ends_with('/')) name.pop_back();
      if (!name.empty()) out.push_back({name, true});
    }
    for (const auto& [key, size] : l.objects) {
      const std::string name = key.substr(prefix.size());
      if (!name.empty()) out.push_back({name, false});
    }
  }
  std::sort(out.begin(), out.end(), [](const StorageEntry& a, const StorageEntry& b) { return a.name < b.name; });
  return out;
}

std::shared_ptr<const ByteSource> open_source(const Location& loc) {
  auto source = open_if_exists(loc);
  if (!source) throw IoError("'" + loc.string() + "' does not exist");
  return source;
}

std::shared_ptr<const ByteSource> open_if_exists(const Location& loc) {
  if (loc.is_local()) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(loc.local(), ec))) return nullptr;
    return std::make_shared<const File>(File::open_read(loc.local()));
  }
  auto client = ObjectStore::for_location(loc);
  const std::optional<int64_t> size = client->head(loc.bucket(), loc.key());
  if (!size) return nullptr;
  return std::make_shared<const StoredObject>(std::move(client), loc, *size);
}

namespace {
// The listed objects below `dir` (at most `limit` names when > 0) by their names relative to it.
ObjectListing list_below(const Location& dir, int limit) {
  if (dir.is_local()) throw ValueError("list_objects is for a bucket prefix, not '" + dir.string() + "'");
  return ObjectStore::for_location(dir)->list(dir.bucket(), dir_prefix(dir), "", limit);
}

std::map<std::string, int64_t, std::less<>> by_name(const Location& dir, ObjectListing listing) {
  const std::string prefix = dir_prefix(dir);
  std::map<std::string, int64_t, std::less<>> out;
  for (auto& [key, size] : listing.objects) {
    std::string name = key.substr(prefix.size());
    if (!name.empty() && !name.ends_with('/')) out.emplace(std::move(name), size);  // "x/": a folder marker
  }
  return out;
}
}  // namespace

std::map<std::string, int64_t, std::less<>> list_objects(const Location& dir) {
  return by_name(dir, list_below(dir, 0));
}

std::optional<std::map<std::string, int64_t, std::less<>>> list_objects_if_fewer(const Location& dir, int limit) {
  if (limit <= 0) throw ValueError("list_objects_if_fewer needs a positive limit, got " + std::to_string(limit));
  ObjectListing listing = list_below(dir, limit);
  if (listing.objects.size() >= static_cast<size_t>(limit)) return std::nullopt;
  return by_name(dir, std::move(listing));
}

std::shared_ptr<const ByteSource> open_listed(const Location& loc, int64_t size) {
  if (loc.is_local() || size < 0) throw ValueError("'" + loc.string() + "' is not a listed object");
  return std::make_shared<const StoredObject>(ObjectStore::for_location(loc), loc, size);
}

std::optional<std::string> read_small(const Location& loc, int64_t max_bytes) {
  if (loc.is_local()) {
    if (!is_file(loc)) {
      reject_symlink(loc.local());
      return std::nullopt;
    }
    return read_file(loc.local(), max_bytes);
  }
  return ObjectStore::for_location(loc)->read_all(loc.bucket(), loc.key(), max_bytes);
}

void remove_file(const Location& loc) {
  if (loc.is_local()) {
    std::error_code ec;
    fs::remove(loc.local(), ec);
    if (ec) throw IoError("cannot remove '" + loc.string() + "': " + ec.message());
    return;
  }
  ObjectStore::for_location(loc)->remove(loc.bucket(), loc.key());
}

void refuse_bucket_root(const Location& dir) {
  if (!dir.is_local() && dir.key().empty())
    throw ValueError("cannot save to the root of the bucket '" + dir.string() + "': give a prefix (" + dir.string() +
                     "/name)");
}

void remove_all(const Location& dir) {
  if (dir.is_local()) {
    std::error_code ec;
    fs::remove_all(dir.local(), ec);
    if (ec) throw IoError("cannot remove '" + dir.string() + "': " + ec.message());
    return;
  }
  if (dir.key().empty()) throw ValueError("refusing to remove every object of the bucket '" + dir.string() + "'");
  ObjectStore::for_location(dir)->remove_all(dir.bucket(), dir_prefix(dir));
}

Location nested_location(const Location& root, std::string_view relative, std::string_view what) {
  if (root.is_local()) return Location(nested_path(root.local(), relative, what));
  try {
    return root / relative;  // Location checks each name
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", what, e.what()));
  }
}

}  // namespace tessel::detail
