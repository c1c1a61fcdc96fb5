// Internal (not installed): bytes a checkpoint is read from, by ranges: a local file (file_io.h)
// or an object in a bucket (storage.h). Page-cache hints and mappings exist for files only; for an
// object they do nothing and map() is nullopt, so a reader falls back to reading.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tessel/runtime/detail/allocation.h"

namespace tessel::detail {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual int64_t size() const = 0;
  // The file or object, for messages.
  virtual std::string where() const = 0;
  // Exactly out.size() bytes at `offset`; a short source is an IoError ("truncated").
  virtual void read_exact(int64_t offset, std::span<std::byte> out) const = 0;
  // How many bytes a reader should ask for at a time: a file's reads are cheap, so slabs that stay
  // in a core's cache while they are checksummed and scattered; an object's cost a request each
  // (tens of ms on a store), so far more per request.
  virtual int64_t read_unit() const { return int64_t{16} << 20; }
  // One contiguous range into several buffers, exactly their total size.
  virtual void read_scatter(int64_t offset, std::span<const iovec> buffers) const;
  virtual void will_need(int64_t /*offset*/, int64_t /*size*/) const noexcept {}
  virtual void read_into_cache(int64_t /*offset*/, int64_t /*size*/) const noexcept {}
  virtual std::optional<MappedBytes> map(int64_t /*offset*/, int64_t /*size*/) const { return std::nullopt; }
  virtual bool map_into(std::byte* /*at*/, int64_t /*offset*/, int64_t /*size*/) const { return false; }
};

}  // namespace tessel::detail
