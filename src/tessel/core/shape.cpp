#include "tessel/core/shape.h"

#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace {

void check_dims(const std::vector<int64_t>& dims) {
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] < 0)
      throw ValueError(fmt::format("shape dimension {} has negative size {}", d, dims[d]));
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) : dims_(dims) { check_dims(dims_); }
Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) { check_dims(dims_); }

Shape Shape::parse(std::string_view text) {
  std::string_view body = text_util::trim(text);
  if (body.size() >= 2 && body.front() == '[' && body.back() == ']')
    body = text_util::trim(body.substr(1, body.size() - 2));
  std::vector<int64_t> dims;
  if (body.empty()) return Shape(dims);
  for (std::string_view item : text_util::split_commas(body)) {
    int64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw ValueError(fmt::format("shape '{}': dimension {} is '{}', not a non-negative integer",
                                   text, dims.size(), item));
    if (value < 0)
      throw ValueError(fmt::format("shape '{}': dimension {} has negative size {}", text,
                                   dims.size(), value));
    dims.push_back(value);
  }
  return Shape(std::move(dims));
}

int64_t Shape::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims_)
    if (__builtin_mul_overflow(n, d, &n))
      throw ValueError(fmt::format("shape {} has more elements than int64 can count", to_string()));
  return n;
}

std::string Shape::to_string() const { return fmt::format("[{}]", fmt::join(dims_, ", ")); }

}  // namespace tessel
