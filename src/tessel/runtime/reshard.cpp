#include "tessel/runtime/reshard.h"

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/runtime/communicator.h"
#include "tessel/runtime/detail/array_builder.h"

namespace tessel {
namespace {

// The source blocks a target box overlaps, as row-major block indices: per dimension the blocks
// [start / len, ceil(stop / len)) are the only candidates, so planning never scans all blocks.
template <class Fn>
void for_each_overlapping_block(const NamedSharding& source, const Shape& shape, const Box& box,
                                Fn&& fn) {
  const size_t rank = shape.rank();
  const Shape len = source.shard_shape(shape);
  std::vector<int64_t> lo(rank), hi(rank), idx(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = box.start(d) / len[d];
    hi[d] = std::min((box.stop(d) + len[d] - 1) / len[d], source.num_blocks(d));
    idx[d] = lo[d];
  }
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * source.num_blocks(d) + idx[d];
    fn(flat);
    size_t d = rank;
    for (; d-- > 0;) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

// Plans every target shard from its overlaps with the source blocks: a block the device holds is
// copied locally, any other from its least-loaded replica. `devices` gets one entry per device of
// the target mesh (mesh order), then the source-only ones.
void plan_transfers(const NamedSharding& source, const NamedSharding& target, const Shape& shape,
                    DType dtype, std::vector<Transfer>& transfers,
                    std::vector<DeviceTraffic>& devices) {
  const auto item = static_cast<int64_t>(item_size(dtype));
  const std::vector<ShardPlacement> blocks = source.distinct_shards(shape);
  const auto source_boxes = source.devices_indices_map(shape);
  std::map<int64_t, size_t> slot;  // device -> index in devices
  auto traffic = [&](int64_t device) -> DeviceTraffic& {
    auto [it, fresh] = slot.try_emplace(device, devices.size());
    if (fresh) {
      devices.emplace_back();
      devices.back().device = device;
    }
    return devices[it->second];
  };
  for (int64_t d : target.mesh().device_ids()) traffic(d);
  for (int64_t d : source.mesh().device_ids()) traffic(d);

  for (const auto& entry : target.devices_indices_map(shape)) {
    // Named copies, not structured bindings: clang 14 (the fuzz build) cannot capture those.
    const int64_t dst = entry.first;
    const Box& box = entry.second;
    if (box.empty()) continue;
    // The source block this device already holds, if it is in the source mesh.
    const Box* held = source.mesh().contains(dst)
                          ? &source_boxes[static_cast<size_t>(source.mesh().position(dst))].second
                          : nullptr;
    for_each_overlapping_block(source, shape, box, [&](int64_t flat) {
      const ShardPlacement& block = blocks[static_cast<size_t>(flat)];
      Box region = box.intersect(block.box);
      if (region.empty()) return;
      const int64_t bytes = region.volume() * item;
      if (held && *held == block.box) {
        transfers.push_back({dst, dst, std::move(region)});
        traffic(dst).bytes_local += bytes;
        return;
      }
      int64_t src = block.devices.front();
      for (int64_t r : block.devices)
        if (traffic(r).bytes_sent < traffic(src).bytes_sent) src = r;
      transfers.push_back({src, dst, std::move(region)});
      traffic(src).bytes_sent += bytes;
      DeviceTraffic& t = traffic(dst);
      t.bytes_received += bytes;
      t.received_from[src] += bytes;
    });
  }
}

}  // namespace

ReshardPlan::ReshardPlan(const NamedSharding& source, const NamedSharding& target,
                         const Shape& shape, DType dtype)
    : header_(fmt::format("reshard {}: {} on {} -> {} on {}", type_string(dtype, shape),
                          source.spec().to_string(), source.mesh().to_string(),
                          target.spec().to_string(), target.mesh().to_string())) {
  plan_transfers(source, target, shape, dtype, transfers_, devices_);
}

const DeviceTraffic& ReshardPlan::device(int64_t id) const {
  for (const DeviceTraffic& t : devices_)
    if (t.device == id) return t;
  throw ValueError(fmt::format("device {} takes no part in this reshard", id));
}

int64_t ReshardPlan::bytes_received() const {
  int64_t n = 0;
  for (const DeviceTraffic& t : devices_) n += t.bytes_received;
  return n;
}

int64_t ReshardPlan::bytes_local() const {
  int64_t n = 0;
  for (const DeviceTraffic& t : devices_) n += t.bytes_local;
  return n;
}

std::string ReshardPlan::to_string() const {
  using text_util::format_bytes;
  std::string out = header_ + "\n";
  out += fmt::format("{:>6}  {:>12}  {:>12}  {:>12}  {}\n", "device", "local", "received", "sent",
                     "received from");
  for (const DeviceTraffic& t : devices_) {
    std::string from;
    for (const auto& [src, bytes] : t.received_from)
      from += fmt::format("{}{}: {}", from.empty() ? "" : ", ", src, format_bytes(bytes));
    out += fmt::format("{:>6}  {:>12}  {:>12}  {:>12}  {}\n", t.device, format_bytes(t.bytes_local),
                       format_bytes(t.bytes_received), format_bytes(t.bytes_sent),
                       from.empty() ? "-" : from);
  }
  out += fmt::format("total: {} already in place, {} copied across devices\n",
                     format_bytes(bytes_local()), format_bytes(bytes_received()));
  return out;
}

ReshardPlan plan_reshard(const Array& array, const NamedSharding& target) {
  return ReshardPlan(array.sharding(), target, array.shape(), array.dtype());
}

Array reshard(const Array& array, const NamedSharding& target) {
  // The plan without its printable header: formatting it would be a tenth of a tiny reshard.
  std::vector<Transfer> transfers;
  std::vector<DeviceTraffic> traffic;
  plan_transfers(array.sharding(), target, array.shape(), array.dtype(), transfers, traffic);
  detail::ArrayBuilder b(array.runtime(), array.shape(), array.dtype(), target, array.label());
  b.share_unchanged(array);
  // Replicas are equal (a reshard copies any one of them), so local ones are stored once.
  b.share_local_replicas();
  b.allocate_all();
  std::vector<CopyTask> tasks;
  tasks.reserve(transfers.size());
  const Mesh& target_mesh = target.mesh();
  for (const Transfer& tr : transfers) {
    auto i = static_cast<size_t>(target_mesh.position(tr.dst_device));
    if (b.is_shared(i)) continue;
    const Shard& s = array.shard(tr.src_device);
    tasks.push_back(CopyTask{tr.src_device, s.buffer.data(), s.box, tr.dst_device, b.data(i),
                             b.shard(i).box, tr.region, b.is_replica(i)});
  }
  array.runtime().communicator().copy(tasks, array.dtype());
  return std::move(b).finish();
}

}  // namespace tessel
