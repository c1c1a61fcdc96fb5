#include "tessel/core/host_array.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"

namespace tessel {

std::string type_string(DType dtype, const Shape& shape) {
  return fmt::format("{}[{}]", short_name(dtype), fmt::join(shape.dims(), ","));
}

HostArray::HostArray(Shape shape, DType dtype)
    : shape_(std::move(shape)),
      dtype_(dtype),
      bytes_(static_cast<size_t>(shape_.num_elements()) * item_size(dtype)) {}

HostArray::HostArray(Shape shape, DType dtype, std::vector<std::byte> bytes)
    : shape_(std::move(shape)), dtype_(dtype), bytes_(std::move(bytes)) {
  auto want = static_cast<size_t>(shape_.num_elements()) * item_size(dtype_);
  if (bytes_.size() != want)
    throw ValueError(fmt::format("host data for {} needs {} bytes, got {}",
                                 tessel::type_string(dtype_, shape_), want, bytes_.size()));
}

void HostArray::reshape(Shape shape) {
  if (shape.num_elements() != shape_.num_elements())
    throw ValueError(fmt::format("cannot view {} as {}: {} elements, not {}", type_string(), shape.to_string(),
                                 shape_.num_elements(), shape.num_elements()));
  shape_ = std::move(shape);
}

std::string HostArray::type_string() const { return tessel::type_string(dtype_, shape_); }

void HostArray::check_item(size_t size) const {
  if (size != item_size(dtype_))
    throw ValueError(fmt::format("cannot view {} elements ({} bytes each) as a {}-byte type",
                                 name(dtype_), item_size(dtype_), size));
}

}  // namespace tessel
