// Internal (not installed): where a checkpoint item's keys (`<param>/.zarray`, `<param>/0.1`,
// `<param>/zarr.json`, `<param>/c/0/1`) live: files below the item directory, the values of an
// OCDBT database in it, or the tensors of a safetensors file or set (`<name>/0.0`, the one chunk
// of each). All hand out a StoredValue that reads byte ranges, so restore reads only the bytes
// each device needs either way.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tessel/checkpoint/detail/io/byte_source.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/core/location.h"

namespace tessel::detail {

// The bytes of one stored value: a range of a file or object, or bytes held in memory (an inline
// value).
class StoredValue {
 public:
  StoredValue(std::shared_ptr<const ByteSource> file, int64_t offset, int64_t size, std::string where);
  StoredValue(std::shared_ptr<const std::string> bytes, std::string where);

  int64_t size() const { return size_; }
  const std::string& where() const { return where_; }
  // Exactly out.size() bytes at `offset` within the value; past its end is an IoError.
  void read(int64_t offset, std::span<std::byte> out) const;
  void read_scatter(int64_t offset, std::span<const iovec> buffers) const;
  // The bytes to read at a time (ByteSource::read_unit); 1 MiB for bytes in memory.
  int64_t read_unit() const { return file_ ? file_->read_unit() : int64_t{1} << 20; }
  // Starts reading the whole value from disk in the background (File::will_need); a no-op in memory.
  void will_need() const noexcept {
    if (file_) file_->will_need(offset_, size_);
  }
  // Reads the whole value into the page cache (File::read_into_cache); a no-op in memory.
  void read_into_cache() const noexcept {
    if (file_) file_->read_into_cache(offset_, size_);
  }
  // The value mapped copy-on-write (File::map); nullopt for bytes in memory or where it cannot be.
  std::optional<MappedBytes> map() const { return file_ ? file_->map(offset_, size_) : std::nullopt; }
  // The value mapped at `at`, inside a reserve_mapping range (File::map_into); false where it cannot be.
  bool map_into(std::byte* at) const { return file_ && file_->map_into(at, offset_, size_); }
  // The part [offset, offset + size), checked to lie within.
  StoredValue slice(int64_t offset, int64_t size, std::string where) const;

 private:
  std::shared_ptr<const ByteSource> file_;
  std::shared_ptr<const std::string> bytes_;
  int64_t offset_ = 0;
  int64_t size_ = 0;
  std::string where_;
};

class KvStore {
 public:
  // The files (or objects) below `dir`.
  static KvStore files(const Location& dir);
  // The OCDBT database in `dir` (its latest version).
  static KvStore ocdbt(const Location& dir);
  // The tensors of an opened safetensors file or set, each under its one chunk's key
  // (`<name>/0.0`), its files opened once.
  static KvStore safetensors(const SafetensorsSet& set);

  bool is_ocdbt() const { return db_ != nullptr; }
  // In a bucket: each read is a request, worth many in flight.
  bool is_remote() const { return !dir_.is_local(); }
  const OcdbtDatabase* database() const { return db_.get(); }
  // nullopt when the key is absent. Keys are '/'-separated; each component is checked.
  std::optional<StoredValue> get(std::string_view key) const;
  // A small value whole (metadata), refused above `max_bytes`; nullopt when absent.
  std::optional<std::string> get_small(std::string_view key, int64_t max_bytes) const;
  // For messages: the file, or the key within the database.
  std::string describe(std::string_view key) const;

 private:
  // The database's data files, each opened once (for an object, its size asked once).
  struct OpenFiles {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const ByteSource>, std::less<>> by_name;
  };
  std::shared_ptr<const ByteSource> data_file(const OcdbtEntry& e) const;

  // In a bucket, the objects below dir_ listed with their sizes where opening each would ask for
  // its size: the whole item in one request when it holds fewer objects than a listing page
  // (every key then answered from it, as TensorStore's two requests per one-chunk array: its
  // metadata and its chunk); else each directory of dir_ (a parameter's metadata and chunks) on
  // the first key asked there, a page per thousand objects. An opened item's checkpoint is
  // committed, so a listing stays true while the item is open.
  struct Listing {
    std::once_flag once;  // a listing that threw is tried again by the next caller
    std::map<std::string, int64_t, std::less<>> sizes;  // by name below the directory
  };
  struct Listings {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<Listing>, std::less<>> by_dir;
    std::once_flag whole_once;
    std::optional<std::map<std::string, int64_t, std::less<>>> whole;  // by key, for a small item
  };
  const Listing& listing(std::string_view dir) const;
  // Every object of the item by key, or nullptr when it holds a page of them or more.
  const std::map<std::string, int64_t, std::less<>>* whole_listing() const;

  Location dir_;
  std::shared_ptr<const OcdbtDatabase> db_;
  std::shared_ptr<OpenFiles> open_files_;
  std::shared_ptr<Listings> listings_;  // files in a bucket
  std::shared_ptr<const std::map<std::string, StoredValue, std::less<>>> tensors_;  // safetensors
};

}  // namespace tessel::detail
