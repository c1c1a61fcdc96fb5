// A Tensor is what SPMD ops take and return: a global array (concrete, with device shards, or
// abstract: shape, dtype and sharding only), plus the mesh axes over which it is a partial sum
// (DTensor's Partial placement), plus its place in the autodiff graph.
//
//   Tensor x(device_put(rt, host, NamedSharding(mesh, {{"data"}, {}})));
//   Tensor y = ops::dot(x, w);        // may be partial over the contracted axes
//   y.partial();                      // {"tensor"} when w's rows were split on tensor
//   Array a = ops::reduce(y).array(); // all-reduced: a plain Array again
//
// A partial tensor's sharding never names its partial axes: devices that differ only along them
// hold contributions of the same block, whose sum is the value. Only ops that are linear in that
// operand keep the partial state; every other op reduces it first.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/runtime/array.h"
#include "tessel/sharding/named_sharding.h"

namespace tessel {

namespace ops::detail {
struct Node;
}

class Tensor {
 public:
  Tensor() = default;
  // A concrete tensor holding `value`, not partial.
  explicit Tensor(Array value);
  // An abstract tensor: no buffers, ops on it only derive shapes, dtypes and shardings.
  // `partial`: the mesh axes over which it stands for a partial sum (for ops deriving shapes).
  static Tensor abstract(Shape shape, DType dtype, NamedSharding sharding, std::vector<std::string> partial = {});
  // A concrete tensor whose shards along `partial` (axes the sharding must not use) are
  // contributions to a sum. Throws ValueError on a used or unknown axis.
  static Tensor partial_sum(Array contributions, std::vector<std::string> partial);

  bool defined() const { return s_ != nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  const NamedSharding& sharding() const;
  const Mesh& mesh() const { return sharding().mesh(); }
  size_t rank() const { return shape().rank(); }
  bool is_abstract() const;
  const std::vector<std::string>& partial() const;
  bool is_partial() const { return !partial().empty(); }
  // The value; throws ValueError when abstract or partial (reduce it first).
  const Array& array() const;
  // The device shards, contributions included; throws ValueError when abstract.
  const Array& shards() const;
  std::string to_string() const;  // "f32[8,4] PartitionSpec('data', None) partial(tensor)"

  // Autodiff (see autodiff.h): the node that produced this tensor, if any.
  const std::shared_ptr<ops::detail::Node>& node() const;
  Tensor with_node(std::shared_ptr<ops::detail::Node> node) const;

 private:
  struct Impl;
  explicit Tensor(std::shared_ptr<const Impl> s) : s_(std::move(s)) {}
  const Impl& get() const;  // throws ValueError on an undefined Tensor
  std::shared_ptr<const Impl> s_;
};

}  // namespace tessel
