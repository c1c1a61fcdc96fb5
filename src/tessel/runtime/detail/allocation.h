// Internal (not installed): the owner of one device allocation. The runtime writes through it
// while it builds an Array; users see it only through a Buffer, read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tessel/runtime/device.h"

namespace tessel::detail {

class Allocation {
 public:
  // Throws OutOfMemoryError from the device.
  Allocation(std::shared_ptr<Device> device, int64_t size, std::string label)
      : device_(std::move(device)), size_(size), label_(std::move(label)),
        data_(device_->allocate(size_, label_)) {}
  ~Allocation() { device_->deallocate(data_, size_, label_); }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  int64_t device() const { return device_->id(); }
  int64_t size() const { return size_; }
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }

 private:
  std::shared_ptr<Device> device_;
  int64_t size_;
  std::string label_;
  std::byte* data_;
};

}  // namespace tessel::detail
