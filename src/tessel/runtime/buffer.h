// A Buffer is one shard's bytes on one device: 64-byte aligned, charged to the device's memory
// accounts until the last Buffer (or Array) sharing it is gone. Read-only: arrays are values.
//
//   const tessel::Buffer& b = array.shard(3).buffer;
//   b.device() == 3;  b.as<float>().size() == array.shard(3).box.volume()
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace tessel {
namespace detail {
class Allocation;
class ArrayBuilder;
}

class Buffer {
 public:
  Buffer() = default;  // no storage: the shard of a device another process owns
  explicit Buffer(std::shared_ptr<const detail::Allocation> allocation)
      : allocation_(std::move(allocation)) {}

  bool valid() const { return allocation_ != nullptr; }
  int64_t device() const;
  int64_t size() const;  // bytes; 0 for an invalid buffer
  const std::byte* data() const;
  std::span<const std::byte> bytes() const { return {data(), static_cast<size_t>(size())}; }
  template <class T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(data()), static_cast<size_t>(size()) / sizeof(T)};
  }
  // True when both share the same allocation. Replicas of a block in one process may hold the
  // same bytes (equal data()) as separate buffers charged to their own devices.
  bool shares_with(const Buffer& other) const { return allocation_ == other.allocation_; }

 private:
  friend class detail::ArrayBuilder;  // makes replicas that share a buffer's bytes
  std::shared_ptr<const detail::Allocation> allocation_;
};

}  // namespace tessel
