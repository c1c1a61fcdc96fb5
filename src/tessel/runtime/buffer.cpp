#include "tessel/runtime/buffer.h"

#include <sys/mman.h>

#include "tessel/runtime/detail/allocation.h"

namespace tessel {

int64_t Buffer::device() const { return allocation_ ? allocation_->device() : -1; }
int64_t Buffer::size() const { return allocation_ ? allocation_->size() : 0; }
const std::byte* Buffer::data() const { return allocation_ ? allocation_->data() : nullptr; }

namespace detail {

MappedBytes::~MappedBytes() {
  if (base_) ::munmap(base_, length_);
}

}  // namespace detail
}  // namespace tessel
