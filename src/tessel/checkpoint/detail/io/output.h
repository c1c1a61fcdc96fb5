// Internal (not installed): where a save writes, local or in a bucket. A local directory gets
// files (direct writes and fsync when durable, as file_io.h does); a bucket prefix gets objects,
// each uploaded in parts of kPartBytes as soon as a part's bytes are all written, from the thread
// that completes it, so that a writer holds only the parts still being filled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "tessel/core/location.h"

namespace tessel::detail {

class OutputFile {
 public:
  virtual ~OutputFile() = default;  // unfinished: an upload is aborted (a local file is left to its directory's cleanup)
  // `bytes` at `offset`; threads may write disjoint ranges at once.
  virtual void write_at(int64_t offset, std::span<const std::byte> bytes) = 0;
  // [offset, offset + size) holds zeros and will not be written (alignment padding): a local file
  // leaves it a hole, an object's part counts it as written.
  virtual void skip(int64_t offset, int64_t size) = 0;
  // Every byte is written: the file is durable, or the object stored. Bytes not written are zeros.
  virtual void finish() = 0;
};

class OutputDir {
 public:
  // Objects are uploaded in parts of this size (S3 wants at least 5 MiB but for the last part).
  static constexpr int64_t kPartBytes = int64_t{16} << 20;

  // `dir` itself (a local directory must exist; a bucket prefix needs nothing).
  static std::shared_ptr<OutputDir> at(const Location& dir, bool durable);
  virtual ~OutputDir() = default;

  const Location& location() const { return dir_; }
  bool durable() const { return durable_; }
  // A new file at `relative` ('/'-separated names, checked), its directories created.
  virtual std::unique_ptr<OutputFile> create(std::string_view relative) = 0;
  // A file another writer created (with its size), written in parts by several processes; local
  // only: an object in a bucket has one writer. Throws IoError in a bucket.
  virtual std::unique_ptr<OutputFile> open_existing(std::string_view relative) = 0;
  // A whole small file at once, durable when the directory is.
  void write(std::string_view relative, std::string_view data);
  // Whether a file is there already.
  virtual bool exists(std::string_view relative) const = 0;
  // Makes the directories created so far durable (fsync); nothing to do in a bucket.
  virtual void sync() = 0;

 protected:
  OutputDir(Location dir, bool durable) : dir_(std::move(dir)), durable_(durable) {}
  Location dir_;
  bool durable_;
};

}  // namespace tessel::detail
