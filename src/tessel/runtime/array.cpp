#include "tessel/runtime/array.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/communicator.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel {

Array::Array(Runtime runtime, Shape shape, DType dtype, NamedSharding sharding,
             std::vector<Shard> shards, std::string label) {
  runtime.check_mesh(sharding.mesh());
  const Mesh& mesh = sharding.mesh();
  if (shards.size() != mesh.device_ids().size())
    throw ValueError(fmt::format("{} has {} devices but {} shards were given", mesh.to_string(),
                                 mesh.device_count(), shards.size()));
  auto boxes = sharding.devices_indices_map(shape);
  const auto item = static_cast<int64_t>(item_size(dtype));
  for (size_t i = 0; i < shards.size(); ++i) {
    const Shard& s = shards[i];
    const auto& [device, box] = boxes[i];
    if (s.device != device)
      throw ValueError(fmt::format("shard {} is for device {}, expected device {} (mesh order)", i,
                                   s.device, device));
    if (!(s.box == box))
      throw ValueError(fmt::format("shard of device {} has box {}, but the sharding gives {}",
                                   device, s.box.to_string(), box.to_string()));
    if (s.replica_id != sharding.replica_id(device))
      throw ValueError(fmt::format("shard of device {} has replica id {}, expected {}", device,
                                   s.replica_id, sharding.replica_id(device)));
    if (!s.buffer.valid()) {
      if (runtime.is_addressable(device))
        throw ValueError(fmt::format("shard of device {} has no buffer, but the device belongs "
                                     "to this process", device));
      continue;
    }
    if (s.buffer.device() != device)
      throw ValueError(fmt::format("shard of device {} has a buffer on device {}", device,
                                   s.buffer.device()));
    if (s.buffer.size() != box.volume() * item)
      throw ValueError(fmt::format("shard of device {} has {} bytes, but box {} of {} needs {}",
                                   device, s.buffer.size(), box.to_string(), name(dtype),
                                   box.volume() * item));
  }
  s_ = std::make_shared<const State>(State{std::move(runtime), std::move(shape), dtype,
                                           std::move(sharding), std::move(shards), std::move(label)});
}

std::string Array::display_name() const { return label().empty() ? type_string() : label(); }

const Shard& Array::shard(int64_t device) const {
  if (!mesh().contains(device))
    throw ValueError(fmt::format("device {} holds no shard of {}: it is not in {}", device,
                                 display_name(), mesh().to_string()));
  return s_->shards[static_cast<size_t>(mesh().position(device))];
}

std::vector<const Shard*> Array::addressable_shards() const {
  std::vector<const Shard*> out;
  for (const Shard& s : s_->shards)
    if (s.is_addressable()) out.push_back(&s);
  return out;
}

bool Array::is_fully_addressable() const {
  return std::all_of(s_->shards.begin(), s_->shards.end(),
                     [](const Shard& s) { return s.is_addressable(); });
}

int64_t Array::nbytes() const {
  return shape().num_elements() * static_cast<int64_t>(item_size(dtype()));
}

namespace detail {

ArrayBuilder::ArrayBuilder(Runtime rt, Shape shape, DType dtype, NamedSharding sharding,
                           std::string label)
    : rt_(std::move(rt)), shape_(std::move(shape)), dtype_(dtype), sharding_(std::move(sharding)),
      label_(std::move(label)) {
  rt_.check_mesh(sharding_.mesh());
  for (auto& [device, box] : sharding_.devices_indices_map(shape_)) {
    shards_.push_back(Shard{device, std::move(box), sharding_.replica_id(device), Buffer()});
    addressable_.push_back(rt_.is_addressable(device));
  }
  allocations_.resize(shards_.size());
  replica_of_.assign(shards_.size(), kNone);
  adopted_.assign(shards_.size(), false);
}

void ArrayBuilder::share_replica(size_t i, size_t of) {
  while (replica_of_[of] != kNone) of = replica_of_[of];
  if (i == of || !addressable_[i] || is_shared(i)) return;
  if (!addressable_[of] || shards_[of].box != shards_[i].box)
    throw std::logic_error("share_replica: shard " + std::to_string(i) + " cannot replicate shard " + std::to_string(of));
  replica_of_[i] = of;
}

void ArrayBuilder::share_local_replicas() {
  for (const LocalBlock& block : local_blocks()) {
    // Onto a holder that already shares a source buffer, if any: then nothing needs writing.
    size_t root = block.first;
    for (size_t r : block.replicas)
      if (is_shared(r) && !is_shared(root)) root = r;
    if (root != block.first) share_replica(block.first, root);
    for (size_t r : block.replicas) share_replica(r, root);
  }
}

void ArrayBuilder::share_within(const std::vector<int64_t>& group) {
  const Mesh& mesh = sharding_.mesh();
  for (size_t k = 0; k < group.size(); ++k) {
    const auto i = static_cast<size_t>(mesh.position(group[k]));
    for (size_t f = 0; f < k; ++f) {
      const auto first = static_cast<size_t>(mesh.position(group[f]));
      if (addressable_[i] && addressable_[first] && shards_[i].box == shards_[first].box) {
        share_replica(i, first);
        break;
      }
    }
  }
}

void ArrayBuilder::adopt(size_t i, MappedBytes mapped) {
  const int64_t bytes = shards_[i].box.volume() * static_cast<int64_t>(item_size(dtype_));
  if (!fills(i) || allocations_[i] || mapped.size() != bytes)
    throw std::logic_error("adopt: shard " + std::to_string(i) + " cannot take " + std::to_string(mapped.size()) +
                           " mapped bytes");
  const std::string& charge = label_.empty() ? type_string(dtype_, shape_) : label_;
  allocations_[i] = std::make_shared<Allocation>(rt_.shared_device(shards_[i].device), std::move(mapped), charge);
  adopted_[i] = true;
}

void ArrayBuilder::allocate_all() {
  const auto item = static_cast<int64_t>(item_size(dtype_));
  const std::string& charge = label_.empty() ? type_string(dtype_, shape_) : label_;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!addressable_[i] || is_shared(i) || allocations_[i] || replica_of_[i] != kNone) continue;
    allocations_[i] = std::make_shared<Allocation>(rt_.shared_device(shards_[i].device),
                                                   shards_[i].box.volume() * item, charge);
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    const size_t of = replica_of_[i];
    if (of == kNone || allocations_[i] || is_shared(i)) continue;
    const Allocation& original = is_shared(of) ? *shards_[of].buffer.allocation_ : *allocations_[of];
    allocations_[i] = std::make_shared<Allocation>(rt_.shared_device(shards_[i].device), original, charge);
  }
}

void ArrayBuilder::share_unchanged(const Array& source) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!source.mesh().contains(shards_[i].device)) continue;
    const Shard& s = source.shard(shards_[i].device);
    if (s.box == shards_[i].box && s.is_addressable()) shards_[i].buffer = s.buffer;
  }
}

std::vector<ArrayBuilder::LocalBlock> ArrayBuilder::local_blocks() const {
  std::vector<LocalBlock> blocks;
  const Mesh& mesh = sharding_.mesh();
  for (const ShardPlacement& p : sharding_.distinct_shards(shape_)) {
    if (p.box.empty()) continue;
    LocalBlock block{shards_.size(), {}};
    for (int64_t d : p.devices) {
      auto i = static_cast<size_t>(mesh.position(d));
      if (!addressable_[i]) continue;
      if (block.first == shards_.size())
        block.first = i;
      else
        block.replicas.push_back(i);
    }
    if (block.first != shards_.size()) blocks.push_back(std::move(block));
  }
  return blocks;
}

Array ArrayBuilder::finish() && {
  for (size_t i = 0; i < shards_.size(); ++i)
    if (allocations_[i]) shards_[i].buffer = Buffer(std::move(allocations_[i]));
  return Array(std::make_shared<const Array::State>(Array::State{
      std::move(rt_), std::move(shape_), dtype_, std::move(sharding_), std::move(shards_),
      std::move(label_)}));
}

}  // namespace detail

namespace {

std::span<std::byte> span_of(std::byte* data, const Box& box, DType dtype) {
  return {data, static_cast<size_t>(box.volume()) * item_size(dtype)};
}

}  // namespace

Array device_put(const Runtime& rt, const HostArray& host, const NamedSharding& sharding,
                 std::string label) {
  const Box whole = Box::full(host.shape());
  const size_t item = item_size(host.dtype());
  return make_array_from_callback(
      rt, host.shape(), host.dtype(), sharding,
      [&](const Box& box, std::span<std::byte> out) {
        copy_region(host.bytes().data(), whole, out.data(), box, box, item);
      },
      std::move(label));
}

Array make_array_from_callback(const Runtime& rt, const Shape& shape, DType dtype,
                               const NamedSharding& sharding, const BoxFiller& fill,
                               std::string label) {
  detail::ArrayBuilder b(rt, shape, dtype, sharding, std::move(label));
  // The first addressable holder of each block gets filled; the other local replicas share it.
  b.share_local_replicas();
  b.allocate_all();
  const std::vector<detail::ArrayBuilder::LocalBlock> blocks = b.local_blocks();
  rt.pool().parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t k) {
    const auto& block = blocks[static_cast<size_t>(k)];
    const Box& box = b.shard(block.first).box;
    fill(box, span_of(b.data(block.first), box, dtype));
  });
  return std::move(b).finish();
}

Array make_array_from_device_callback(const Runtime& rt, const Shape& shape, DType dtype,
                                      const NamedSharding& sharding, const DeviceBoxFiller& fill,
                                      std::string label) {
  detail::ArrayBuilder b(rt, shape, dtype, sharding, std::move(label));
  b.allocate_all();
  rt.pool().parallel_for(static_cast<int64_t>(b.size()), [&](int64_t k) {
    auto i = static_cast<size_t>(k);
    const Shard& s = b.shard(i);
    if (b.addressable(i) && !s.box.empty()) fill(s.device, s.box, span_of(b.data(i), s.box, dtype));
  });
  return std::move(b).finish();
}

namespace {

// Each dimension's global size from a process's part: the part times the dimension's blocks,
// divided by how many of them this process's devices hold.
Shape infer_global_shape(const Runtime& rt, const NamedSharding& sharding, const Shape& local) {
  std::vector<int64_t> blocks(local.rank()), dims(local.rank());
  for (size_t d = 0; d < local.rank(); ++d) blocks[d] = sharding.num_blocks(d);
  const Shape unit(blocks);  // one element per block: a device's box starts at its block index
  std::vector<std::set<int64_t>> held(local.rank());
  for (int64_t device : sharding.mesh().device_ids()) {
    if (!rt.is_addressable(device)) continue;
    const Box b = sharding.device_box(device, unit);
    for (size_t d = 0; d < local.rank(); ++d) held[d].insert(b.start(d));
  }
  for (size_t d = 0; d < local.rank(); ++d) {
    const auto parts = static_cast<int64_t>(held[d].size());
    if (parts == 0) throw ValueError("this process holds no device of " + sharding.mesh().to_string());
    if (local.dims()[d] * blocks[d] % parts != 0) {
      throw ValueError(fmt::format("local data of shape {}: dimension {} ({}) is not {} of {} blocks", local.to_string(), d,
                                   local.dims()[d], parts, blocks[d]));
    }
    dims[d] = local.dims()[d] * blocks[d] / parts;
  }
  return Shape(dims);
}

}  // namespace

Array make_array_from_process_local_data(const Runtime& rt, const NamedSharding& sharding, const HostArray& local,
                                         std::optional<Shape> global_shape, std::string label) {
  rt.check_mesh(sharding.mesh());
  const Shape shape = global_shape ? *global_shape : infer_global_shape(rt, sharding, local.shape());
  if (shape.rank() != local.shape().rank()) {
    throw ValueError(fmt::format("local data of shape {} cannot be part of global shape {}", local.shape().to_string(),
                                 shape.to_string()));
  }
  // The box this process's blocks cover, which the local data must be exactly.
  std::vector<int64_t> lo(shape.rank(), INT64_MAX), hi(shape.rank(), 0);
  int64_t covered = 0;
  for (const ShardPlacement& p : sharding.distinct_shards(shape)) {
    if (std::none_of(p.devices.begin(), p.devices.end(), [&](int64_t d) { return rt.is_addressable(d); })) continue;
    covered += p.box.volume();
    for (size_t d = 0; d < shape.rank(); ++d) {
      lo[d] = std::min(lo[d], p.box.start(d));
      hi[d] = std::max(hi[d], p.box.stop(d));
    }
  }
  if (covered == 0) throw ValueError("this process holds no device of " + sharding.mesh().to_string());
  const Box part(lo, hi);
  if (part.volume() != covered) {
    throw ValueError(fmt::format("the blocks of process {} under {} for global shape {} do not form one box, so no "
                                 "local array can hold them",
                                 rt.process_index(), sharding.to_string(), shape.to_string()));
  }
  if (!(part.shape() == local.shape())) {
    throw ValueError(fmt::format("process {} holds {} of global shape {}: its local data must have shape {}, not {}",
                                 rt.process_index(), part.to_string(), shape.to_string(), part.shape().to_string(),
                                 local.shape().to_string()));
  }
  const size_t item = item_size(local.dtype());
  return make_array_from_callback(
      rt, shape, local.dtype(), sharding,
      [&](const Box& box, std::span<std::byte> out) { copy_region(local.bytes().data(), part, out.data(), box, box, item); },
      std::move(label));
}

std::optional<HostArray> gather(const Array& array, int root) {
  const Runtime& rt = array.runtime();
  if (root < 0 || root >= rt.process_count()) {
    throw ValueError(fmt::format("gather({}): process {} does not exist; there are {}", array.display_name(), root,
                                 rt.process_count()));
  }
  if (rt.process_count() == 1) return to_host(array);
  int64_t at = 0;  // the root's first device receives, into host memory
  while (rt.device(at).process_index() != root) ++at;
  std::optional<HostArray> host;
  if (rt.process_index() == root) host.emplace(array.shape(), array.dtype());
  const Box whole = Box::full(array.shape());
  std::vector<CopyTask> tasks;
  for (const ShardPlacement& block : array.sharding().distinct_shards(array.shape())) {
    const Shard& src = array.shard(block.devices.front());  // replica 0
    tasks.push_back({src.device, src.is_addressable() ? src.buffer.data() : nullptr, src.box, at,
                     host ? host->mutable_bytes().data() : nullptr, whole, src.box});
  }
  rt.communicator().copy(tasks, array.dtype());
  return host;
}

HostArray to_host(const Array& array) {
  HostArray host(array.shape(), array.dtype());
  const Box whole = Box::full(array.shape());
  const size_t item = item_size(array.dtype());
  std::vector<const Shard*> sources;
  for (const ShardPlacement& block : array.sharding().distinct_shards(array.shape())) {
    const Shard* src = nullptr;
    for (int64_t d : block.devices)
      if (!src && array.shard(d).is_addressable()) src = &array.shard(d);
    if (!src)
      throw ValueError(fmt::format("to_host({}): block {} is held only by devices of other "
                                   "processes; gather() it", array.display_name(),
                                   block.box.to_string()));
    sources.push_back(src);
  }
  std::byte* out = host.mutable_bytes().data();
  array.runtime().pool().parallel_for(static_cast<int64_t>(sources.size()), [&](int64_t k) {
    const Shard& s = *sources[static_cast<size_t>(k)];
    copy_region(s.buffer.data(), s.box, out, whole, s.box, item);
  });
  return host;
}

}  // namespace tessel
