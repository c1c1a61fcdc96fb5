// Internal (not installed): one device's buffer. The runtime writes through it while it builds an
// Array; users see it only through a Buffer, read-only. The memory is a Block that replicas of a
// block in one process may share: equal bytes need storing once, yet each device is charged for
// its buffer as a real device would be (limits and statistics do not depend on the sharing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tessel/runtime/device.h"

namespace tessel::detail {

// Memory from a device's cache, given back to it when the last buffer using it goes.
class Block {
 public:
  Block(std::shared_ptr<Device> device, int64_t size, const std::string& label)
      : device_(std::move(device)), size_(size), data_(device_->take_block(size_, label)) {}
  ~Block() { device_->return_block(data_, size_); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::byte* data() const { return data_; }

 private:
  std::shared_ptr<Device> device_;
  int64_t size_;
  std::byte* data_;
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
