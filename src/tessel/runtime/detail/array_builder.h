// Internal (not installed): assembles a new Array. Boxes come from the sharding; each addressable
// shard either gets a fresh buffer (allocate) that the caller fills through data(), or shares an
// existing buffer holding the same box (alias), which copies nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tessel/runtime/array.h"
#include "tessel/runtime/detail/allocation.h"

namespace tessel::detail {

class ArrayBuilder {
 public:
  ArrayBuilder(Runtime rt, Shape shape, DType dtype, NamedSharding sharding, std::string label);

  size_t size() const { return shards_.size(); }
  const Shard& shard(size_t i) const { return shards_[i]; }  // mesh order
  bool addressable(size_t i) const { return addressable_[i]; }
  // Allocates every addressable shard not aliased yet. Throws OutOfMemoryError.
  void allocate_all();
  void alias(size_t i, const Buffer& buffer);
  std::byte* data(size_t i) const { return allocations_[i] ? allocations_[i]->data() : nullptr; }
  Array finish() &&;

 private:
  Runtime rt_;
  Shape shape_;
  DType dtype_;
  NamedSharding sharding_;
  std::string label_;
  std::vector<Shard> shards_;
  std::vector<bool> addressable_;
  std::vector<std::shared_ptr<Allocation>> allocations_;
};

}  // namespace tessel::detail
