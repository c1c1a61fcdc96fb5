// A PartitionSpec says, per array dimension, which mesh axes split it: none (replicated along
// that dimension), one axis, or an ordered tuple of axes (first = major). Dimensions past the
// end of the spec are unsharded. Stored JAX-normalized: a 1-tuple is the axis itself, an empty
// tuple is "unsharded", so equal shardings compare equal.
//
//   tessel::PartitionSpec spec{{"fsdp"}, {}, {"data", "tensor"}};
//   spec.to_string() == "PartitionSpec('fsdp', None, ('data', 'tensor'))"
//   spec.to_json()   == R"(["fsdp",null,["data","tensor"]])"
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

class Mesh;

// The mesh axes that split one dimension, major first. Empty: not sharded.
using DimSharding = std::vector<std::string>;

class PartitionSpec {
 public:
  PartitionSpec() = default;
  // Throws ValueError on an empty axis name or an axis used twice (in one or two dimensions).
  explicit PartitionSpec(std::vector<DimSharding> dims);
  PartitionSpec(std::initializer_list<DimSharding> dims)
      : PartitionSpec(std::vector<DimSharding>(dims)) {}

  // JSON as MaxText dumps it: an array of null, "axis" or ["a", "b"] ([] also means null).
  // Throws ParseError (bad JSON, with line and column) or ValueError (bad structure).
  static PartitionSpec from_json(std::string_view text, std::string_view source = "spec");

  size_t size() const { return dims_.size(); }
  const DimSharding& operator[](size_t dim) const { return dims_[dim]; }
  const std::vector<DimSharding>& dims() const { return dims_; }
  // Mesh axes used by any dimension, in order of appearance.
  std::vector<std::string> used_axes() const;

  // Throws ValueError if an axis is not in `mesh` or the spec has more entries than `rank`.
  // `what` (a parameter path, say) prefixes the message.
  void validate(const Mesh& mesh, size_t rank, std::string_view what = {}) const;

  std::string to_string() const;  // JAX repr: PartitionSpec('fsdp', None, ('a', 'b'))
  std::string to_json() const;     // compact JSON, JAX-normalized

  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;

 private:
  std::vector<DimSharding> dims_;
};

}  // namespace tessel
