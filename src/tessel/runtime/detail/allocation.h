// Internal (not installed): one device's buffer. The runtime writes through it while it builds an
// Array; users see it only through a Buffer, read-only. The memory is a Block that replicas of a
// block in one process may share: equal bytes need storing once, yet each device is charged for
// its buffer as a real device would be (limits and statistics do not depend on the sharing).
// A Block may also be a file's bytes mapped copy-on-write (MappedBytes): a restored shard whose
// stored bytes are already its layout needs no fresh memory, which the kernel would first zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "tessel/runtime/device.h"

namespace tessel::detail {

// A private (copy-on-write) mapping of a file range; unmapped when destroyed. Made by the layer
// that owns the file (File::map in the checkpoint layer); data() lies `size` bytes within it.
class MappedBytes {
 public:
  MappedBytes(void* base, size_t length, std::byte* data, int64_t size)
      : base_(base), length_(length), data_(data), size_(size) {}
  MappedBytes(MappedBytes&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), length_(other.length_), data_(other.data_), size_(other.size_) {}
  MappedBytes& operator=(MappedBytes&&) = delete;
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;
  ~MappedBytes();

  std::byte* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void* base_;
  size_t length_;
  std::byte* data_;
  int64_t size_;
};

// Memory from a device's cache, given back to it when the last buffer using it goes; or a mapped
// file range, unmapped then.
class Block {
 public:
  Block(std::shared_ptr<Device> device, int64_t size, const std::string& label)
      : device_(std::move(device)), size_(size), data_(device_->take_block(size_, label)) {}
  explicit Block(MappedBytes mapped)
      : size_(mapped.size()), data_(mapped.data()), mapped_(std::make_unique<MappedBytes>(std::move(mapped))) {}
  ~Block() {
    if (device_) device_->return_block(data_, size_);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::byte* data() const { return data_; }

 private:
  std::shared_ptr<Device> device_;  // null for a mapping
  int64_t size_;
  std::byte* data_;
  std::unique_ptr<MappedBytes> mapped_;
};

class Allocation {
 public:
  // Fresh memory on `device`. Throws OutOfMemoryError from the device.
  Allocation(std::shared_ptr<Device> device, int64_t size, std::string label)
      : device_(std::move(device)), size_(size), label_(std::move(label)) {
    device_->charge(size_, label_);
    try {
      block_ = std::make_shared<const Block>(device_, size_, label_);
    } catch (...) {
      device_->uncharge(size_, label_);
      throw;
    }
  }
  // `mapped` as a buffer on `device`, charged like fresh memory. Throws OutOfMemoryError.
  Allocation(std::shared_ptr<Device> device, MappedBytes mapped, std::string label)
      : device_(std::move(device)), size_(mapped.size()), label_(std::move(label)) {
    device_->charge(size_, label_);
    try {
      block_ = std::make_shared<const Block>(std::move(mapped));
    } catch (...) {
      device_->uncharge(size_, label_);
      throw;
    }
  }
  // A buffer on `device` holding the bytes of `original` (a replica). Throws OutOfMemoryError.
  Allocation(std::shared_ptr<Device> device, const Allocation& original, std::string label)
      : device_(std::move(device)), size_(original.size_), label_(std::move(label)), block_(original.block_) {
    device_->charge(size_, label_);
  }
  ~Allocation() { device_->uncharge(size_, label_); }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  int64_t device() const { return device_->id(); }
  int64_t size() const { return size_; }
  std::byte* data() { return block_->data(); }
  const std::byte* data() const { return block_->data(); }

 private:
  std::shared_ptr<Device> device_;
  int64_t size_;
  std::string label_;
  std::shared_ptr<const Block> block_;
};

}  // namespace tessel::detail
