// Staging: the blocks a save writes, taken from device arrays (copied, or in place for a
// synchronous save) or from a caller's host memory.
#include <cstring>
#include <map>
#include <new>
#include <set>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/item_io.h"
#include "tessel/checkpoint/detail/staged_state.h"
#include "tessel/core/error.h"

namespace tessel {

StagedState::StagedState() : impl_(std::make_unique<Impl>()) {}
StagedState::~StagedState() = default;
StagedState::StagedState(StagedState&&) noexcept = default;
StagedState& StagedState::operator=(StagedState&&) noexcept = default;
int64_t StagedState::bytes() const { return impl_->bytes; }

StagedState::Impl::HostCopy StagedState::Impl::copy_of(std::span<const std::byte> bytes) {
  if (bytes.empty()) return nullptr;
  // Only blocks a direct write takes (1 MiB and more) need a whole page; smaller ones a cache line.
  const size_t align = bytes.size() >= (size_t{1} << 20) ? 4096 : 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, (bytes.size() + align - 1) / align * align));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, bytes.data(), bytes.size());
  return HostCopy(p);
}

namespace {

StagedState::Impl stage_impl(const State& state, bool copy) {
  StagedState::Impl s;
  for (const auto& [path, var] : state) {
    const Array& a = var.array(path);
    if (!s.runtime) s.runtime = a.runtime();
    if (!(*s.runtime == a.runtime())) {
      throw ValueError("cannot save '" + path + "' with the others: its array lives on another runtime");
    }
    StagedState::Impl::Param p{path, var.kind(), var.partitioning(), a.shape(), a.dtype(), a.sharding(), {}};
    for (const ShardPlacement& placement : a.sharding().distinct_shards(a.shape())) {
      // The first holder this process owns writes the block; in one process that is replica 0.
      const Shard* holder = nullptr;
      for (int64_t d : placement.devices) {
        if (a.runtime().is_addressable(d)) {
          holder = &a.shard(d);
          break;
        }
      }
      if (holder == nullptr || holder->replica_id != 0) continue;
      std::span<const std::byte> bytes = holder->buffer.bytes();
      if (copy) {
        s.owned.push_back(StagedState::Impl::copy_of(bytes));
        bytes = {s.owned.back().get(), bytes.size()};
      }
      s.bytes += static_cast<int64_t>(bytes.size());
      p.blocks.push_back({placement.box, bytes});
    }
    if (!copy) s.held.push_back(a);
    s.params.push_back(std::move(p));
  }
  return s;
}

}  // namespace

StagedState stage(const State& state) {
  StagedState staged;
  *staged.impl_ = stage_impl(state, /*copy=*/true);
  return staged;
}

StagedState stage_host(std::vector<HostLeaf> leaves) {
  StagedState staged;
  StagedState::Impl& s = *staged.impl_;
  std::set<std::string> paths;
  for (HostLeaf& leaf : leaves) {
    const std::string what = "'" + leaf.path + "'";
    if (!paths.insert(leaf.path).second) throw ValueError("the leaf " + what + " is given twice");
    leaf.sharding.spec().validate(leaf.sharding.mesh(), leaf.shape.rank(), what);
    // Empty blocks hold nothing to write: only the others are wanted (their starts differ).
    std::map<std::vector<int64_t>, size_t> wanted;  // block start -> index among the distinct blocks
    const std::vector<ShardPlacement> distinct = leaf.sharding.distinct_shards(leaf.shape);
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (distinct[i].box.empty()) continue;
      wanted.emplace(std::vector<int64_t>(distinct[i].box.starts().begin(), distinct[i].box.starts().end()), i);
    }
    std::vector<bool> seen(distinct.size(), false);
    StagedState::Impl::Param p{leaf.path, leaf.kind, leaf.partitioning, leaf.shape, leaf.dtype, leaf.sharding, {}};
    for (const auto& [box, bytes] : leaf.blocks) {
      if (box.rank() == leaf.shape.rank() && box.empty() && bytes.empty()) continue;
      auto it = wanted.find(std::vector<int64_t>(box.starts().begin(), box.starts().end()));
      if (box.rank() != leaf.shape.rank() || it == wanted.end() || !(distinct[it->second].box == box)) {
        throw ValueError(what + ": block " + box.to_string() + " is not one of the blocks of " +
                         leaf.sharding.to_string() + " for shape " + leaf.shape.to_string());
      }
      if (seen[it->second]) throw ValueError(what + ": block " + box.to_string() + " is given twice");
      seen[it->second] = true;
      const int64_t expect = box.volume() * static_cast<int64_t>(item_size(leaf.dtype));
      if (static_cast<int64_t>(bytes.size()) != expect) {
        throw ValueError(what + ": block " + box.to_string() + " has " + std::to_string(bytes.size()) +
                         " bytes, not the " + std::to_string(expect) + " of " + std::string(name(leaf.dtype)));
      }
      s.bytes += expect;
      p.blocks.push_back({box, bytes});
    }
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (!seen[i] && !distinct[i].box.empty()) {
        throw ValueError(what + ": block " + distinct[i].box.to_string() + " is missing");
      }
    }
    s.params.push_back(std::move(p));
  }
  return staged;
}

StagedState detail::stage_in_place(const State& state) {
  StagedState staged;
  const_cast<StagedState::Impl&>(staged.impl()) = stage_impl(state, /*copy=*/false);
  return staged;
}

}  // namespace tessel
