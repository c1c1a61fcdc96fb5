// A dense array in host memory: shape, dtype and row-major little-endian bytes. What device_put
// takes and to_host returns.
//
//   auto h = tessel::HostArray::from<float>({2, 3}, {0, 1, 2, 3, 4, 5});
//   h.values<float>()[4] == 4.0f;  h.nbytes() == 24
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"

namespace tessel {

class HostArray {
 public:
  HostArray() = default;  // a float32 scalar 0
  HostArray(Shape shape, DType dtype);  // zero-filled
  // Throws ValueError unless bytes.size() == num_elements * item_size.
  HostArray(Shape shape, DType dtype, std::vector<std::byte> bytes);

  // Typed construction for float, double, int32_t, int64_t, uint8_t, int8_t, bool.
  template <class T>
  static HostArray from(Shape shape, std::span<const T> values);
  template <class T>
  static HostArray from(Shape shape, std::initializer_list<T> values) {
    return from<T>(std::move(shape), std::span<const T>(values.begin(), values.size()));
  }

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t nbytes() const { return static_cast<int64_t>(bytes_.size()); }
  std::span<const std::byte> bytes() const { return bytes_; }
  std::span<std::byte> mutable_bytes() { return bytes_; }
  // The same row-major bytes as another shape of as many elements (no copy). Throws ValueError
  // when the element counts differ.
  void reshape(Shape shape);

  // The elements as T; throws ValueError unless sizeof(T) == item_size(dtype()). For bf16 and
  // f16 use uint16_t (bit patterns; see half.h).
  template <class T>
  std::span<const T> values() const& {
    check_item(sizeof(T));
    return {reinterpret_cast<const T*>(bytes_.data()), bytes_.size() / sizeof(T)};
  }
  // A view into a temporary would dangle: keep the HostArray in a variable.
  template <class T>
  std::span<const T> values() const&& = delete;
  template <class T>
  std::span<T> mutable_values() {
    check_item(sizeof(T));
    return {reinterpret_cast<T*>(bytes_.data()), bytes_.size() / sizeof(T)};
  }

  std::string type_string() const;  // "f32[2,3]"
  friend bool operator==(const HostArray&, const HostArray&) = default;  // bitwise

 private:
  void check_item(size_t size) const;
  Shape shape_;
  DType dtype_ = DType::kF32;
  std::vector<std::byte> bytes_ = std::vector<std::byte>(4);
};

// The DType a C++ element type stands for (float -> f32, ...).
template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<bool>() { return DType::kBool; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<int8_t>() { return DType::kI8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }

template <class T>
HostArray HostArray::from(Shape shape, std::span<const T> values) {
  const auto* p = reinterpret_cast<const std::byte*>(values.data());
  return HostArray(std::move(shape), dtype_of<T>(), std::vector<std::byte>(p, p + values.size_bytes()));
}

// "f32[2,3]": the JAX-style type of an array.
std::string type_string(DType dtype, const Shape& shape);

}  // namespace tessel
