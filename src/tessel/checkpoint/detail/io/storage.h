// Internal (not installed): what the checkpoint readers ask of a Location, whatever its kind: a
// local directory tree (symlinks never followed, as file_io.h does) or a prefix in a bucket (S3 or GCS),
// where a "directory" is a key prefix ending in '/' and a file is an object.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/checkpoint/detail/io/byte_source.h"
#include "tessel/core/location.h"

namespace tessel::detail {

// A regular file (not through a symlink) or an object.
bool is_file(const Location& loc);
// A plain directory (not a symlink), or a prefix with objects below it.
bool is_directory(const Location& loc);
inline bool exists(const Location& loc) { return is_file(loc) || is_directory(loc); }

struct StorageEntry {
  std::string name;
  bool is_directory = false;
};
// The files and plain directories in `dir`, sorted by name (symlinks left out). Throws IoError when
// it cannot be listed.
std::vector<StorageEntry> list_directory(const Location& dir);

// The file or object for reading by ranges. Throws IoError when it is absent (or a symlink).
std::shared_ptr<const ByteSource> open_source(const Location& loc);
// The same, or nullptr when nothing is there (a symlink is still an IoError).
std::shared_ptr<const ByteSource> open_if_exists(const Location& loc);
// The objects below the bucket prefix `dir` at every depth, by their names relative to it, with
// their sizes: one listing (a request per page of names) where opening each would ask for each
// object's size. Throws ValueError for a local directory.
std::map<std::string, int64_t, std::less<>> list_objects(const Location& dir);
// The same from one request (one page of at most `limit` names) when there are fewer than `limit`
// objects; nullopt when there may be more.
std::optional<std::map<std::string, int64_t, std::less<>>> list_objects_if_fewer(const Location& dir, int limit);
// The object at `loc` for reading by ranges, its size as a listing gave it: no request made.
std::shared_ptr<const ByteSource> open_listed(const Location& loc, int64_t size);
// The whole file or object, refused above `max_bytes`; nullopt when there is none.
std::optional<std::string> read_small(const Location& loc, int64_t max_bytes);

// Throws ValueError for a bucket's root as the place of a save: a leftover cleanup there would
// take the bucket's other objects with it.
void refuse_bucket_root(const Location& dir);

// The file or object, when it is there.
void remove_file(const Location& loc);
// Everything below `dir`: a local directory tree, or every object under a bucket prefix (never a
// bucket's root: refused). Best effort is the caller's choice: errors are thrown.
void remove_all(const Location& dir);

// `root / relative` for a '/'-separated path read from metadata, each name checked (nested_path in
// file_io.h for a local root); `what` names its origin in the message.
Location nested_location(const Location& root, std::string_view relative, std::string_view what);

}  // namespace tessel::detail
