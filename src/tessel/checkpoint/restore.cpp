// Restoring an item onto any sharding, in four steps: match the target's tree against the item's
// (nothing is read or allocated until they agree), plan each leaf's blocks, map the blocks that
// are exactly their uncompressed chunks (restore_map.cpp), read every other block from the chunks
// that intersect it (restore_read.cpp).
#include <unistd.h>

#include <chrono>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/restore_plan.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  const size_t show = std::min<size_t>(items.size(), 20);
  for (size_t i = 0; i < show; ++i) s += "\n  " + items[i];
  if (items.size() > show) s += "\n  ... and " + std::to_string(items.size() - show) + " more";
  return s;
}

// Match: the item's leaf for each of the target's, or an error listing the leaves missing on
// either side (those only in the checkpoint unless `partial`).
std::vector<const ParamMetadata*> match(const CheckpointItem& item, const State& target, bool partial) {
  std::vector<const ParamMetadata*> leaves;
  std::vector<std::string> missing, extra;
  for (const auto& [path, var] : target) {
    const ParamMetadata* p = item.metadata().find(path);
    if (!p) {
      missing.push_back(path);
    } else {
      leaves.push_back(p);
    }
  }
  if (!partial) {
    for (const auto& p : item.metadata().params) {
      if (!target.contains(p.path) && !is_empty_node(p.value_type)) extra.push_back(p.path);
    }
  }
  if (!missing.empty() || !extra.empty()) {
    std::string msg = "the checkpoint '" + item.dir().string() + "' and the target differ:";
    if (!missing.empty()) msg += "\nin the target but not in the checkpoint (" + std::to_string(missing.size()) + "):" + join_list(missing);
    if (!extra.empty()) {
      msg += "\nin the checkpoint but not in the target (" + std::to_string(extra.size()) + "):" + join_list(extra) +
             "\n(restore with partial to take only the target's leaves)";
    }
    throw ValueError(msg);
  }
  return leaves;
}

// Physical memory: the ceiling for all device buffers of one restore (virtual devices share it).
const int64_t kMaxRestoreBytes = [] {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : int64_t{1} << 40;
}();

// Plan: each leaf's chunks and its target blocks. Sizes from a corrupt file must not reach the
// allocator, so the total of the target buffers (the only device memory a restore takes) is
// checked against the machine first. Returns that total.
int64_t plan(const Runtime& rt, const CheckpointItem& item, const State& target,
             const std::vector<const ParamMetadata*>& leaves, std::vector<detail::LeafRead>& plans) {
  for (const ParamMetadata* meta : leaves) {
    const Variable& want = target.at(meta->path);
    detail::ChunkSource source = item.chunks(*meta);
    if (want.shape() != source.zarr.shape()) {
      throw ValueError("'" + meta->path + "': the checkpoint holds " + type_string(source.zarr.dtype(), source.zarr.shape()) +
                       ", the target wants " + type_string(want.dtype(), want.shape()));
    }
    if (!want.sharding()) {
      throw ValueError("the target leaf '" + meta->path + "' has no sharding: give the target one (eval_shape on a mesh) "
                       "or restore with a TargetSpec (its placement)");
    }
    rt.check_mesh(want.sharding()->mesh());
    detail::LeafRead p(std::move(source));
    p.target_dtype = want.dtype();
    p.allow_missing = !item.metadata().store_array_data_equal_to_fill_value && p.zarr.fill_value().has_value();
    p.kind = want.kind();
    p.partitioning = !want.partitioning().empty() ? want.partitioning() : meta->partitioning;
    p.builder = std::make_unique<detail::ArrayBuilder>(rt, p.zarr.shape(), p.target_dtype, *want.sharding(), p.path);
    plans.push_back(std::move(p));
  }
  int64_t target_bytes = 0;
  for (auto& p : plans) {
    for (size_t i = 0; i < p.builder->size(); ++i) {
      if (!p.builder->addressable(i)) continue;
      const int64_t n = p.builder->shard(i).box.volume() * static_cast<int64_t>(item_size(p.target_dtype));
      if (n > kMaxRestoreBytes - target_bytes) {
        throw ValueError("restoring '" + p.path + "' would take the devices past " + std::to_string(kMaxRestoreBytes) +
                         " bytes in all, more than this machine's memory: is its shape " + p.zarr.shape().to_string() +
                         " right?");
      }
      target_bytes += n;
    }
  }
  return target_bytes;
}

}  // namespace

State restore(const Runtime& rt, const CheckpointItem& item, const State& target, const RestoreOptions& options,
              RestoreStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<const ParamMetadata*> leaves = match(item, target, options.partial);
  std::vector<detail::LeafRead> plans;
  const int64_t target_bytes = plan(rt, item, target, leaves, plans);
  detail::ReadCounters counters;
  const int64_t bytes_mapped = options.map_chunks ? detail::map_chunks(plans, options.readers, options.verify_checksums, counters) : 0;
  // Local replicas of a block share its buffer: written once, stored once, each device charged.
  for (auto& p : plans) {
    p.builder->share_local_replicas();
    p.builder->allocate_all();
  }
  const int64_t staging_peak =
      detail::read_chunks(plans, options.readers, options.staging_bytes, options.verify_checksums, counters);
  State out;
  for (auto& p : plans) out.insert(p.path, Variable(p.kind, std::move(*p.builder).finish(), p.partitioning));
  if (stats) {
    stats->bytes_read = counters.bytes;
    stats->chunks_read = counters.chunks;
    stats->bytes_mapped = bytes_mapped;
    stats->target_bytes = target_bytes;
    stats->staging_peak = staging_peak;
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

State restore(const Runtime& rt, const CheckpointItem& item, const TargetSpec& spec, const RestoreOptions& options,
              RestoreStats* stats) {
  const State target = make_target(item, spec, rt.device_count());
  RestoreOptions partial = options;
  partial.partial = true;  // the spec chose the leaves
  State restored = restore(rt, item, target, partial, stats);
  return spec.rename.empty() ? restored : rename_prefixes(restored, spec.rename);
}

namespace {

// The saved leaf `path`, checked to hold `box`, ready to read it as `dtype` (default: the saved one).
detail::LeafRead box_read(const CheckpointItem& item, const std::string& path, const Box& box,
                          std::optional<DType> dtype) {
  const ParamMetadata* meta = item.metadata().find(path);
  if (!meta) throw ValueError("'" + path + "' is not one of the arrays of " + item.dir().string());
  detail::LeafRead p(item.chunks(*meta));
  const Shape& shape = p.zarr.shape();
  if (box.rank() != shape.rank() || Box::full(shape).intersect(box) != box)
    throw ValueError("'" + path + "': " + box.to_string() + " is not a box of its shape " + shape.to_string());
  p.target_dtype = dtype.value_or(p.zarr.dtype());
  p.allow_missing = !item.metadata().store_array_data_equal_to_fill_value && p.zarr.fill_value().has_value();
  const int64_t bytes = box.volume() * static_cast<int64_t>(item_size(p.target_dtype));
  if (bytes > kMaxRestoreBytes)
    throw ValueError("reading '" + path + "' " + box.to_string() + " would take " + std::to_string(bytes) +
                     " bytes, more than this machine's memory");
  return p;
}

void read_into(detail::LeafRead p, const Box& box, std::byte* out, const RestoreOptions& options) {
  if (box.empty()) return;
  p.dests.push_back({out, box});
  std::vector<detail::LeafRead> plans;
  plans.push_back(std::move(p));
  detail::ReadCounters counters;
  detail::read_chunks(plans, options.readers, options.staging_bytes, options.verify_checksums, counters);
}

}  // namespace

HostArray read_box(const CheckpointItem& item, const std::string& path, const Box& box, std::optional<DType> dtype,
                   const RestoreOptions& options) {
  detail::LeafRead p = box_read(item, path, box, dtype);
  HostArray out(box.shape(), p.target_dtype);
  read_into(std::move(p), box, out.mutable_bytes().data(), options);
  return out;
}

void read_box_into(const CheckpointItem& item, const std::string& path, const Box& box, std::span<std::byte> out,
                   std::optional<DType> dtype, const RestoreOptions& options) {
  detail::LeafRead p = box_read(item, path, box, dtype);
  const auto want = static_cast<size_t>(box.volume()) * item_size(p.target_dtype);
  if (out.size() != want)
    throw ValueError("'" + path + "': " + box.to_string() + " takes " + std::to_string(want) + " bytes, not " +
                     std::to_string(out.size()));
  read_into(std::move(p), box, out.data(), options);
}

State restore(const Runtime& rt, const Location& item_dir, const State& target, const RestoreOptions& options,
              RestoreStats* stats) {
  return restore(rt, CheckpointItem::open(item_dir), target, options, stats);
}

State restore(const Runtime& rt, const Location& item_dir, const TargetSpec& spec, const RestoreOptions& options,
              RestoreStats* stats) {
  return restore(rt, CheckpointItem::open(item_dir), spec, options, stats);
}

}  // namespace tessel
