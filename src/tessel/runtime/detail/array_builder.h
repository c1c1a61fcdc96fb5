// Internal (not installed): assembles a new Array. Boxes come from the sharding; each addressable
// shard either gets a fresh buffer (allocate_all) that the caller fills through data(), or shares
// a buffer of the source array holding the same box (share_unchanged), which copies nothing, or
// is marked a replica of another local shard (share_replica) and gets a buffer of its own device
// holding the other's bytes: written once, stored once. The result skips the public constructor's
// checks: it is correct by construction.
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
  // Shards whose device holds the same box in `source` share its buffer.
  void share_unchanged(const Array& source);
  bool is_shared(size_t i) const { return shards_[i].buffer.valid(); }
  // Shard i (addressable, same box) will hold shard `of`'s bytes: only for blocks whose values are
  // equal by construction (never partial sums). Before allocate_all.
  void share_replica(size_t i, size_t of);
  // share_replica for the other local replicas of every block, onto its first local holder.
  void share_local_replicas();
  // share_replica among the addressable members of `group` (device ids) with equal boxes, onto
  // the first: for a collective's group, whose members receive equal bytes for equal boxes.
  void share_within(const std::vector<int64_t>& group);
  // Shard i (one the caller fills) takes `mapped` as its buffer: a file's bytes that already are
  // its block, so the caller no longer fills it. Before allocate_all; its replicas may share it.
  void adopt(size_t i, MappedBytes mapped);
  // Allocates every addressable shard not shared; replicas get their own account on the bytes
  // of the shard they replicate. Throws OutOfMemoryError.
  void allocate_all();
  bool is_replica(size_t i) const { return replica_of_[i] != kNone; }
  // Whether the caller writes shard i: addressable, neither shared, a replica nor adopted.
  bool fills(size_t i) const { return addressable_[i] && !is_shared(i) && !is_replica(i) && !adopted_[i]; }
  // Where shard i's bytes are (a replica's are its original's); null before allocate_all.
  std::byte* data(size_t i) const { return allocations_[i] ? allocations_[i]->data() : nullptr; }
  // Each non-empty block this process holds: its first addressable holder and the other local
  // replicas (shard indices), for filling a block once and copying it.
  struct LocalBlock {
    size_t first;
    std::vector<size_t> replicas;
  };
  std::vector<LocalBlock> local_blocks() const;
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
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> replica_of_;  // kNone, or the shard whose bytes shard i shares
  std::vector<bool> adopted_;       // shard i's buffer came from adopt()
};

}  // namespace tessel::detail
