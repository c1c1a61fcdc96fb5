// The global shape of an array: a list of non-negative dimension sizes; rank 0 is a scalar.
//
//   tessel::Shape s{16, 8};
//   s.rank() == 2; s.num_elements() == 128; s.to_string() == "[16, 8]"
//   tessel::Shape::parse("16,8") == s
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);  // throws ValueError on a negative size

  // "16,8" or "[16, 8]"; "" and "[]" give a scalar. Throws ValueError naming the bad item.
  static Shape parse(std::string_view text);

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t dim) const { return dims_[dim]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }

  // Product of the sizes (1 for a scalar). Throws ValueError if it overflows int64.
  int64_t num_elements() const;
  std::string to_string() const;

  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<int64_t> dims_;
};

}  // namespace tessel
