// A NamedSharding places an array on a Mesh by a PartitionSpec. For a global shape it gives each
// device's Box exactly as JAX's NamedSharding.devices_indices_map does: a dimension split over
// axes (a, b) has size(a) * size(b) blocks and a device's block is coord(a) * size(b) + coord(b).
//
// Uneven sizes: every block is ceil(n / k) long and the last ones are shorter or empty (the zarr
// chunk grid has the same shape). JAX instead rejects indivisible shapes; check_divisible()
// applies that rule where a caller wants it.
//
//   tessel::NamedSharding s(tessel::Mesh::parse("data=2,fsdp=4"), {{"fsdp"}, {}});
//   s.device_box(5, {16, 8}) == tessel::Box({4, 0}, {8, 8});   // device 5: data=1, fsdp=1
//   s.replica_id(5) == 1;  s.shard_shape({16, 8}) == tessel::Shape{4, 8}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/shape.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel {

// One distinct block of an array and the devices that hold a copy of it (mesh order; the first
// one is replica 0).
struct ShardPlacement {
  Box box;
  std::vector<int64_t> devices;
};

class NamedSharding {
 public:
  // Throws ValueError if the spec names an axis the mesh lacks.
  NamedSharding(Mesh mesh, PartitionSpec spec);

  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }

  // How many blocks dimension `dim` is split into (1 past the end of the spec).
  int64_t num_blocks(size_t dim) const;
  // The Box of `device_id` for an array of `shape`. Throws ValueError if the spec has more
  // entries than the shape has dimensions, or the device is not in the mesh.
  Box device_box(int64_t device_id, const Shape& shape) const;
  // (device id, Box) for every device, in mesh order.
  std::vector<std::pair<int64_t, Box>> devices_indices_map(const Shape& shape) const;
  // The per-dimension block length ceil(n / k): every shard's shape when the shape divides.
  Shape shard_shape(const Shape& shape) const;
  // 0 for the first device (in mesh order) holding its block, 1 for the next copy, ...
  int64_t replica_id(int64_t device_id) const;
  // JAX's Shard.replica_id for an array of `shape`: the devices holding equal blocks, numbered in
  // mesh order. The same as replica_id(device_id) unless a dimension has size 0; then every block
  // is empty along it and devices that differ only along its axes hold equal blocks.
  int64_t replica_id(int64_t device_id, const Shape& shape) const;
  // One entry per distinct block in row-major block order; together they tile the array.
  std::vector<ShardPlacement> distinct_shards(const Shape& shape) const;
  // True when every device holds the whole array (only size-1 axes, if any, are used).
  bool is_fully_replicated() const;
  // JAX's rule: every sharded dimension is divisible by its number of blocks. Throws ValueError
  // naming `what`, the dimension, its size and the axes otherwise.
  void check_divisible(const Shape& shape, std::string_view what = {}) const;

  std::string to_string() const;  // NamedSharding(mesh=Mesh(...), spec=PartitionSpec(...))

  // Same mesh and the same spec up to trailing unsharded dimensions (JAX's equivalence).
  friend bool operator==(const NamedSharding& a, const NamedSharding& b);

 private:
  void check_rank(const Shape& shape) const;
  // The Box of the device at mesh `coords`, given the block shape (shard_shape(shape)).
  Box block_box(const std::vector<int64_t>& coords, const Shape& block, const Shape& shape) const;
  // Block index of a device (by its mesh coordinates) along dimension `dim`.
  int64_t block_index(const std::vector<int64_t>& coords, size_t dim) const;

  Mesh mesh_;
  PartitionSpec spec_;
  std::vector<std::vector<size_t>> dim_axes_;  // per spec entry: mesh axis indices, major first
  std::vector<size_t> replica_axes_;           // mesh axes the spec does not use, in mesh order
};

}  // namespace tessel
