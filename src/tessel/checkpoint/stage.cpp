// Staging: the blocks a save writes, taken from device arrays (copied, or in place for a
// synchronous save) or from a caller's host memory.
#include <cstring>
#include <map>
#include <new>
#include <set>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/staged.h"
#include "tessel/core/error.h"

namespace tessel {

namespace detail {

std::vector<BlockBytes> blocks_to_write(const Array& a) {
  std::vector<BlockBytes> out;
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
    out.push_back({placement.box, holder->buffer.bytes()});
  }
  return out;
}

StagedLeaves::HostCopy StagedLeaves::copy_of(std::span<const std::byte> bytes) {
  if (bytes.empty()) return nullptr;
  // Only blocks a direct write takes (1 MiB and more) need a whole page; smaller ones a cache line.
  const size_t align = bytes.size() >= (size_t{1} << 20) ? 4096 : 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, (bytes.size() + align - 1) / align * align));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, bytes.data(), bytes.size());
  return HostCopy(p);
}

}  // namespace detail

namespace {

detail::StagedLeaves stage_arrays(const State& state, bool copy) {
  detail::StagedLeaves s;
  for (const auto& [path, var] : state) {
    const Array& a = var.array(path);
    if (!s.runtime) s.runtime = a.runtime();
    if (!(*s.runtime == a.runtime())) {
      throw ValueError("cannot save '" + path + "' with the others: its array lives on another runtime");
    }
    detail::StagedLeaves::Leaf leaf{path, var.kind(), var.partitioning(), a.shape(), a.dtype(), a.sharding(), {}};
    for (detail::BlockBytes& b : detail::blocks_to_write(a)) {
      if (copy) {
        s.owned.push_back(detail::StagedLeaves::copy_of(b.bytes));
        b.bytes = {s.owned.back().get(), b.bytes.size()};
      }
      s.bytes += static_cast<int64_t>(b.bytes.size());
      leaf.blocks.push_back(b);
    }
    if (!copy) s.held.push_back(a);
    s.leaves.push_back(std::move(leaf));
  }
  return s;
}

}  // namespace

StagedState::StagedState() : leaves_(std::make_unique<detail::StagedLeaves>()) {}
StagedState::~StagedState() = default;
StagedState::StagedState(StagedState&&) noexcept = default;
StagedState& StagedState::operator=(StagedState&&) noexcept = default;
int64_t StagedState::bytes() const { return leaves_->bytes; }

State StagedState::abstract() const {
  State out;
  for (const auto& l : leaves_->leaves)
    out.insert(l.path, Variable::abstract(l.kind, l.shape, l.dtype, l.sharding, l.partitioning));
  return out;
}

ProcessGroup& StagedState::processes() const {
  static SingleProcessGroup one;
  if (leaves_->group) return *leaves_->group;
  return leaves_->runtime ? leaves_->runtime->processes() : one;
}

void StagedState::write_to(StateWriter& writer) const {
  std::vector<HostBlock> blocks;
  for (const auto& l : leaves_->leaves) {
    blocks.clear();
    for (const detail::BlockBytes& b : l.blocks) blocks.push_back({b.box, b.bytes});
    writer.write(l.path, blocks);
  }
}

StagedState stage(const State& state) {
  StagedState staged;
  *staged.leaves_ = stage_arrays(state, /*copy=*/true);
  return staged;
}

StagedState stage_in_place(const State& state) {
  StagedState staged;
  *staged.leaves_ = stage_arrays(state, /*copy=*/false);
  return staged;
}

StagedState stage_host(std::vector<HostLeaf> leaves) { return stage_host(std::move(leaves), HostProcesses{}); }

StagedState stage_host(std::vector<HostLeaf> leaves, const HostProcesses& processes) {
  StagedState staged;
  detail::StagedLeaves& s = *staged.leaves_;
  s.group = processes.group;
  // In one process every distinct block is this process's to write; in a job, those whose
  // replica 0 is on one of its devices.
  const auto mine = [&](const NamedSharding& sharding, const Shape& shape, const ShardPlacement& placement) {
    if (processes.group == nullptr) return true;
    for (int64_t d : placement.devices)
      if (sharding.replica_id(d, shape) == 0) return processes.local_devices.count(d) > 0;
    return false;
  };
  std::set<std::string> paths;
  for (HostLeaf& leaf : leaves) {
    const std::string what = "'" + leaf.path + "'";
    if (!paths.insert(leaf.path).second) throw ValueError("the leaf " + what + " is given twice");
    leaf.sharding.spec().validate(leaf.sharding.mesh(), leaf.shape.rank(), what);
    // Empty blocks hold nothing to write: only the others are wanted (their starts differ).
    std::map<std::vector<int64_t>, size_t> wanted;  // block start -> index among the distinct blocks
    const std::vector<ShardPlacement> distinct = leaf.sharding.distinct_shards(leaf.shape);
    std::vector<bool> ours(distinct.size());
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (distinct[i].box.empty()) continue;
      ours[i] = mine(leaf.sharding, leaf.shape, distinct[i]);
      wanted.emplace(std::vector<int64_t>(distinct[i].box.starts().begin(), distinct[i].box.starts().end()), i);
    }
    std::vector<bool> seen(distinct.size(), false);
    detail::StagedLeaves::Leaf l{leaf.path, leaf.kind, leaf.partitioning, leaf.shape, leaf.dtype, leaf.sharding, {}};
    for (const auto& [box, bytes] : leaf.blocks) {
      if (box.rank() == leaf.shape.rank() && box.empty() && bytes.empty()) continue;
      auto it = wanted.find(std::vector<int64_t>(box.starts().begin(), box.starts().end()));
      if (box.rank() != leaf.shape.rank() || it == wanted.end() || !(distinct[it->second].box == box)) {
        throw ValueError(what + ": block " + box.to_string() + " is not one of the blocks of " +
                         leaf.sharding.to_string() + " for shape " + leaf.shape.to_string());
      }
      if (!ours[it->second]) {
        throw ValueError(what + ": block " + box.to_string() + " is not this process's to write: its replica 0 is on " +
                         "another process's device");
      }
      if (seen[it->second]) throw ValueError(what + ": block " + box.to_string() + " is given twice");
      seen[it->second] = true;
      const int64_t expect = box.volume() * static_cast<int64_t>(item_size(leaf.dtype));
      if (static_cast<int64_t>(bytes.size()) != expect) {
        throw ValueError(what + ": block " + box.to_string() + " has " + std::to_string(bytes.size()) +
                         " bytes, not the " + std::to_string(expect) + " of " + std::string(name(leaf.dtype)));
      }
      s.bytes += expect;
      l.blocks.push_back({box, bytes});
    }
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (!seen[i] && ours[i]) throw ValueError(what + ": block " + distinct[i].box.to_string() + " is missing");
    }
    s.leaves.push_back(std::move(l));
  }
  return staged;
}

}  // namespace tessel
