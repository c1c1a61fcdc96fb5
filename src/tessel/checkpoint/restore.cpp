// Restoring an item onto any sharding: each device's block is read from the chunks that intersect
// it (uncompressed chunks by byte ranges, or mapped when one is exactly the block; compressed ones
// decoded once for every block that needs them), with host staging bounded by
// RestoreOptions::staging_bytes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include <unistd.h>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/chunk_source.h"
#include "tessel/checkpoint/detail/crc32c.h"
#include "tessel/checkpoint/detail/kvstore.h"
#include "tessel/checkpoint/detail/parallel.h"
#include "tessel/checkpoint/zarr.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/detail/kernels.h"

namespace tessel {
namespace fs = std::filesystem;
using detail::default_threads;
using detail::key_prefix;
using detail::max_stored_bytes;
using detail::open_zarr;
using detail::run_parallel;

namespace {

// Host staging: callers take bytes before decoding a chunk and give them back after; a request
// above the budget waits until it has the budget to itself.
class StagingBudget {
 public:
  explicit StagingBudget(int64_t budget) : budget_(std::max<int64_t>(budget, 1)) {}
  int64_t acquire(int64_t bytes) {
    std::unique_lock lock(mu_);
    const int64_t want = std::min(bytes, budget_);
    cv_.wait(lock, [&] { return used_ + want <= budget_; });
    used_ += want;
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    return want;
  }
  void release(int64_t taken, int64_t bytes) {
    {
      std::lock_guard lock(mu_);
      used_ -= taken;
      held_ -= bytes;
    }
    cv_.notify_all();
  }
  int64_t peak() const { return peak_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int64_t budget_;
  int64_t used_ = 0;
  int64_t held_ = 0;
  int64_t peak_ = 0;
};

// Holds staging bytes for one scope.
class StagingLease {
 public:
  StagingLease(StagingBudget& budget, int64_t bytes) : budget_(budget), bytes_(bytes), taken_(budget.acquire(bytes)) {}
  ~StagingLease() { budget_.release(taken_, bytes_); }
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;

 private:
  StagingBudget& budget_;
  int64_t bytes_, taken_;
};


// One local block of a leaf, written from the chunks (its other local replicas share its buffer).
struct Destination {
  std::byte* data;
  Box box;
};

// A worker's reusable host buffer. A restore reads hundreds of chunks; a fresh buffer for each
// would fault in (and have the kernel clear) every page of it again.
class Scratch {
 public:
  // A buffer of n bytes, reused while n is within `keep` bytes; larger ones are temporary.
  std::span<std::byte> get(size_t n, size_t keep, std::unique_ptr<std::byte[]>& temporary) {
    if (n > keep) {
      temporary.reset(new std::byte[n]);
      return {temporary.get(), n};
    }
    if (n > size_) {
      data_.reset();
      data_.reset(new std::byte[n]);
      size_ = n;
    }
    return {data_.get(), n};
  }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

// Per worker: one buffer for stored bytes and one for decoded ones, `keep` bytes each at most.
struct WorkerBuffers {
  Scratch stored, decoded;
  size_t keep = 0;
};

// Slabs of a raw chunk small enough to stay in a core's L2 between the read and the scatter.
constexpr int64_t kSlabBytes = int64_t{1} << 20;


struct LeafRead : detail::ChunkSource {
  DType target_dtype;
  bool allow_missing;  // absent chunks take the fill value
  std::unique_ptr<detail::ArrayBuilder> builder;
  std::vector<Destination> dests;
  std::string kind;
  Partitioning partitioning;
};

// A block that may map its chunks' file bytes: uncompressed chunks of its dtype that lie side by
// side in the block's buffer, in order (one chunk, or runs of rows of a shard split into chunks).
struct MappedBlock {
  size_t param;
  size_t shard;  // the block's first local holder (its local replicas share its buffer)
  std::vector<std::vector<int64_t>> chunks;  // in the order of their bytes in the block
  std::optional<detail::MappedBytes> bytes;  // once mapped; read in and checked chunk by chunk

  // Chunk k's bytes in the mapping.
  std::span<const std::byte> chunk(size_t k, int64_t chunk_bytes) const {
    return {bytes->data() + static_cast<int64_t>(k) * chunk_bytes, static_cast<size_t>(chunk_bytes)};
  }
};

// Below this, reading into the device's cached blocks costs less than a mapping per chunk.
constexpr int64_t kMinMappedBytes = int64_t{1} << 20;

// The blocks of `p` whose stored chunks, side by side, are the block's bytes
// (RestoreOptions::map_chunks): found from the metadata alone, no file opened yet. A block of
// several chunks is mapped chunk by chunk into one range, so each chunk must be whole pages.
void mappable_blocks(const LeafRead& p, size_t param, std::vector<MappedBlock>& out) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  if (p.zarr.compression().kind != Compression::Kind::kNone || p.zarr.chunk_checksum() || p.zarr.sharded() ||
      p.zarr.dtype() != p.target_dtype || chunk_bytes < kMinMappedBytes) {
    return;
  }
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t chunk_elements = chunk_bytes / static_cast<int64_t>(item_size(p.target_dtype));
  for (const detail::ArrayBuilder::LocalBlock& block : p.builder->local_blocks()) {
    const Box& box = p.builder->shard(block.first).box;
    if (!p.builder->fills(block.first)) continue;
    auto indices = p.zarr.chunks_in(box);
    if (indices.empty() || (indices.size() > 1 && (page <= 0 || chunk_bytes % page != 0))) continue;
    // Chunk k must be the k-th run of the block's elements.
    bool side_by_side = true;
    for (size_t k = 0; k < indices.size() && side_by_side; ++k)
      side_by_side = box.run_offset(p.zarr.chunk_box(indices[k])) == static_cast<int64_t>(k) * chunk_elements;
    if (!side_by_side || static_cast<int64_t>(indices.size()) * chunk_elements != box.volume()) continue;
    out.push_back({param, block.first, std::move(indices), std::nullopt});
  }
}

// Locates a candidate's chunks and maps them side by side. A block with a chunk that is absent,
// of the wrong size or cannot be mapped stays unmapped: the reads take it and report what is
// wrong with it. The files are closed again (the mappings keep them): a checkpoint may have more
// chunk files than a process may hold open.
void map_block(const LeafRead& p, MappedBlock& m) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  const size_t n = m.chunks.size();
  std::optional<detail::MappedBytes> range;
  if (n > 1) {
    std::optional<detail::MappedBytes> reserved = detail::reserve_mapping(chunk_bytes * static_cast<int64_t>(n));
    if (!reserved) return;
    range.emplace(std::move(*reserved));
  }
  for (size_t k = 0; k < n; ++k) {  // one file open at a time
    const std::optional<detail::StoredValue> value = locate_chunk(p, m.chunks[k], p.zarr.chunk_key(m.chunks[k]));
    if (!value || value->size() != chunk_bytes) return;
    if (n > 1) {
      if (!value->map_into(range->data() + static_cast<int64_t>(k) * chunk_bytes)) return;
    } else {
      std::optional<detail::MappedBytes> mapped = value->map();
      if (!mapped) return;
      range.emplace(std::move(*mapped));
    }
  }
  m.bytes.emplace(std::move(*range));
}

// Reads chunk k of a mapped block in (from the disk when its pages are not cached: `cached` is
// what resident() said before) and compares it with its saved CRC-32C.
void check_mapped_chunk(const LeafRead& p, const MappedBlock& m, size_t k, bool cached, bool verify) {
  const std::string key = p.zarr.chunk_key(m.chunks[k]);
  const std::span<const std::byte> view = m.chunk(k, p.zarr.chunk_bytes());
  if (!cached) {  // read() brings it in faster than the mapping's page faults
    if (auto value = locate_chunk(p, m.chunks[k], key)) value->read_into_cache();
  }
  detail::populate(view, chunk_what(p, key));
  if (verify && p.meta->crc32c.contains(key)) check_crc(p, key, detail::crc32c(view));
}

// Physical memory: the ceiling for all device buffers of one restore (virtual devices share it).
const int64_t kMaxRestoreBytes = [] {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : int64_t{1} << 40;
}();

struct ReadTask {
  size_t param;
  std::vector<int64_t> index;
  std::vector<size_t> dests;
};

// Copies (casting when the dtypes differ) the part of `chunk` each destination needs.
void scatter(const LeafRead& p, const Box& chunk, const std::byte* src, const ReadTask& task) {
  const DType from = p.zarr.dtype(), to = p.target_dtype;
  const size_t in = item_size(from), out = item_size(to);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    const Box region = chunk.intersect(dst.box);
    for_each_run(region, chunk, dst.box, [&](int64_t s, int64_t t, int64_t n) {
      if (from == to) {
        std::memcpy(dst.data + t * out, src + s * in, static_cast<size_t>(n) * in);
      } else {
        detail::convert_run(from, src + s * in, to, dst.data + t * out, n);
      }
    });
  }
}

void fill_missing(const LeafRead& p, const Box& chunk, const ReadTask& task) {
  const size_t item = item_size(p.target_dtype);
  std::vector<std::byte> value(item);
  const double fill = p.zarr.fill_value().value_or(0.0);
  detail::convert_run(DType::kF64, reinterpret_cast<const std::byte*>(&fill), p.target_dtype, value.data(), 1);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    for_each_run(chunk.intersect(dst.box), chunk, dst.box, [&](int64_t, int64_t t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst.data + (t + i) * static_cast<int64_t>(item), value.data(), item);
    });
  }
}

struct Counters {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> chunks{0};
};

// An uncompressed chunk of the target dtype: each destination's runs are read straight into its
// buffer, consecutive file runs in one preadv of at most kSlabBytes, so that the checksum
// that follows each read finds the bytes in cache.
void read_ranges(const LeafRead& p, const detail::StoredValue& f, const Box& chunk, const ReadTask& task,
                 const std::string& key, bool verify, Counters& counters) {
  const int64_t item = static_cast<int64_t>(item_size(p.zarr.dtype()));
  const int64_t piece = std::max<int64_t>(1, kSlabBytes / item);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    const Box region = chunk.intersect(dst.box);
    // The whole chunk lands in this buffer, in file order: check it against the saved checksum.
    const bool check = verify && region == chunk && p.meta->crc32c.contains(key);
    uint32_t crc = 0;
    std::vector<iovec> iov;
    int64_t run_start = -1, run_end = -1;
    auto flush = [&] {
      if (iov.empty()) return;
      f.read_scatter(run_start * item, iov);
      counters.bytes += (run_end - run_start) * item;
      for (const iovec& v : iov) {
        auto* at = static_cast<std::byte*>(v.iov_base);
        if (check) crc = detail::crc32c({at, v.iov_len}, crc);
      }
      iov.clear();
    };
    for_each_run(region, chunk, dst.box, [&](int64_t s, int64_t t, int64_t n) {
      for (int64_t done = 0; done < n;) {
        const int64_t len = std::min(n - done, piece);
        if (s + done != run_end || iov.size() >= 1024 || run_end - run_start + len > piece) {
          flush();
          run_start = s + done;
        }
        iov.push_back({dst.data + (t + done) * item, static_cast<size_t>(len * item)});
        run_end = s + done + len;
        done += len;
      }
    });
    flush();
    if (check) check_crc(p, key, crc);
  }
}

// True when this process's destinations need all of the chunk in short pieces (column blocks out
// of row-major chunks): then reading the chunk once, slab by slab, beats one read per piece. A
// process that needs only part of it reads just its pieces, so no process reads others' bytes.
bool small_runs(const LeafRead& p, const Box& chunk, const ReadTask& task) {
  int64_t runs = 0, elements = 0;
  for (size_t d : task.dests) {
    const Box region = chunk.intersect(p.dests[d].box);
    elements += region.volume();
    for_each_run(region, chunk, p.dests[d].box, [&](int64_t, int64_t, int64_t) { ++runs; });
  }
  const int64_t bytes = elements * static_cast<int64_t>(item_size(p.zarr.dtype()));
  return runs > 64 && bytes / runs < (int64_t{64} << 10) && bytes >= p.zarr.chunk_bytes();
}

// An uncompressed chunk read whole, in slabs along its first dimension of about kSlabBytes,
// each scattered (and cast, if the dtypes differ) into the destinations.
void read_slabs(const LeafRead& p, const detail::StoredValue& f, const Box& chunk, const ReadTask& task,
                const std::string& key, StagingBudget& staging, WorkerBuffers& buffers, bool verify,
                Counters& counters) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  const size_t rank = chunk.rank();
  const int64_t rows = rank == 0 ? 1 : chunk.extent(0);
  const int64_t row_bytes = rows == 0 ? 0 : chunk_bytes / rows;
  const int64_t slab_rows =
      std::clamp<int64_t>(row_bytes == 0 ? rows : kSlabBytes / row_bytes, 1, std::max<int64_t>(rows, 1));
  const int64_t slab_bytes = slab_rows * row_bytes;
  const bool reused = static_cast<size_t>(slab_bytes) <= buffers.keep;
  StagingLease lease(staging, reused ? 0 : slab_bytes);
  std::unique_ptr<std::byte[]> temporary;
  const std::span<std::byte> buf = buffers.stored.get(static_cast<size_t>(slab_bytes), buffers.keep, temporary);
  uint32_t crc = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
    const int64_t r1 = std::min(rows, r0 + slab_rows);
    std::span<std::byte> slab(buf.data(), static_cast<size_t>((r1 - r0) * row_bytes));
    f.read(r0 * row_bytes, slab);
    counters.bytes += static_cast<int64_t>(slab.size());
    if (verify) crc = detail::crc32c(slab, crc);
    Box slab_box = chunk;
    if (rank > 0) {
      std::vector<int64_t> start(chunk.starts().begin(), chunk.starts().end());
      std::vector<int64_t> stop(chunk.stops().begin(), chunk.stops().end());
      start[0] = chunk.start(0) + r0;
      stop[0] = chunk.start(0) + r1;
      slab_box = Box(std::move(start), std::move(stop));
    }
    scatter(p, slab_box, slab.data(), task);
  }
  if (verify) check_crc(p, key, crc);
}



// Large chunks only: a cold restore of one pread per worker leaves the disk's queue nearly empty
// (2 readers: ~2 GB/s where 8 concurrent readers get ~2.7), so each worker hints the chunk that
// is picked after the running ones. Small chunks are left to the kernel's readahead, and chunks
// inside zarr3 shards too (finding one reads its shard's index, which the task would read again).
// Errors are the read's to report.
void will_need(const LeafRead& p, std::span<const int64_t> index) noexcept {
  if (p.zarr.chunk_bytes() < (int64_t{1} << 20) || p.zarr.sharded()) return;
  try {
    if (auto value = locate_chunk(p, index, p.zarr.chunk_key(index))) value->will_need();
  } catch (...) {
  }
}

void run_task(const LeafRead& p, const ReadTask& task, StagingBudget& staging, WorkerBuffers& buffers, bool verify,
              Counters& counters) {
  const Box chunk = p.zarr.chunk_box(task.index);
  const std::string key = p.zarr.chunk_key(task.index);
  const std::optional<detail::StoredValue> value = locate_chunk(p, task.index, key);
  if (!value) {
    if (!p.allow_missing) throw ValueError(chunk_what(p, key) + " is missing");
    fill_missing(p, chunk, task);
    return;
  }
  const detail::StoredValue& f = *value;
  const int64_t size = f.size();
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  // A chunk that carries its own CRC-32C is read whole, like a compressed one.
  const bool raw = p.zarr.compression().kind == Compression::Kind::kNone && !p.zarr.chunk_checksum();
  if (raw && size != chunk_bytes) {
    throw ValueError(chunk_what(p, key) + ": " + std::to_string(size) + " bytes, an uncompressed chunk of " +
                     p.zarr.chunks().to_string() + " " + std::string(name(p.zarr.dtype())) + " has " +
                     std::to_string(chunk_bytes));
  }
  counters.chunks += 1;
  if (raw && p.zarr.dtype() == p.target_dtype && !small_runs(p, chunk, task)) {
    read_ranges(p, f, chunk, task, key, verify, counters);
    return;
  }
  if (raw) {
    read_slabs(p, f, chunk, task, key, staging, buffers, verify, counters);
    return;
  }
  // A compressed chunk: decoded once, whole, for every destination.
  if (size > max_stored_bytes(chunk_bytes)) {
    throw ValueError(chunk_what(p, key) + ": " + std::to_string(size) + " stored bytes for a chunk of " +
                     std::to_string(chunk_bytes) + ": not a compressed chunk of this array");
  }
  // A chunk that is exactly one destination's block (the same mesh) decodes straight into it.
  const Destination* whole = task.dests.size() == 1 ? &p.dests[task.dests.front()] : nullptr;
  if (whole && (whole->box != chunk || p.zarr.dtype() != p.target_dtype ||
                chunk.volume() * static_cast<int64_t>(item_size(p.target_dtype)) != chunk_bytes)) {
    whole = nullptr;
  }
  const int64_t staged = size + (whole ? 0 : chunk_bytes);
  const bool reused = static_cast<size_t>(size) <= buffers.keep && static_cast<size_t>(chunk_bytes) <= buffers.keep;
  StagingLease lease(staging, reused ? 0 : staged);
  std::unique_ptr<std::byte[]> temporary_stored, temporary_decoded;
  const size_t keep = reused ? buffers.keep : 0;
  const std::span<std::byte> stored = buffers.stored.get(static_cast<size_t>(size), keep, temporary_stored);
  f.read(0, stored);
  counters.bytes += size;
  if (verify) check_crc(p, key, detail::crc32c(stored));
  const std::span<const std::byte> encoded = strip_chunk_crc(p, key, stored);
  if (whole) {
    const std::span<std::byte> out(whole->data, static_cast<size_t>(chunk_bytes));
    decompress(p.zarr.compression(), encoded, out, chunk_what(p, key));
    return;
  }
  const std::span<std::byte> decoded = buffers.decoded.get(static_cast<size_t>(chunk_bytes), keep, temporary_decoded);
  decompress(p.zarr.compression(), encoded, decoded, chunk_what(p, key));
  scatter(p, chunk, decoded.data(), task);
}

std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  const size_t show = std::min<size_t>(items.size(), 20);
  for (size_t i = 0; i < show; ++i) s += "\n  " + items[i];
  if (items.size() > show) s += "\n  ... and " + std::to_string(items.size() - show) + " more";
  return s;
}



NamedSharding fallback_sharding(const Runtime& rt, const ParamMetadata& p, const Shape& shape,
                                const RestoreOptions& options) {
  switch (options.fallback) {
    case Placement::kTarget:
      throw ValueError("the target leaf '" + p.path + "' has no sharding: give the target one (eval_shape on a mesh) "
                       "or restore with Placement::kAsSaved or kReplicated");
    case Placement::kAsSaved: {
      if (!p.sharding) {
        throw ValueError("'" + p.path + "' has no saved NamedSharding in _sharding; restore it with a target sharding "
                         "or Placement::kReplicated");
      }
      if (p.sharding->mesh.device_count() > rt.device_count()) {
        throw ValueError("'" + p.path + "' was saved on " + p.sharding->mesh.to_string() + " (" +
                         std::to_string(p.sharding->mesh.device_count()) + " devices), more than the runtime's " +
                         std::to_string(rt.device_count()) + "; give a target sharding");
      }
      NamedSharding s(p.sharding->mesh, p.sharding->spec);
      s.device_box(s.mesh().device_ids().front(), shape);  // checks the spec fits the shape
      return s;
    }
    case Placement::kReplicated: {
      Mesh mesh = options.mesh ? *options.mesh : Mesh({{"replica", rt.device_count()}});
      return NamedSharding(mesh, PartitionSpec{});
    }
  }
  throw ValueError("unknown placement");
}

State restore_impl(const Runtime& rt, const fs::path& item_dir, const State* target,
                   const RestoreOptions& options, RestoreStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);

  // Structure first: nothing is read or allocated until the trees agree.
  std::vector<std::pair<std::string, const ParamMetadata*>> leaves;
  if (target) {
    std::vector<std::string> missing, extra;
    for (const auto& [path, var] : *target) {
      const ParamMetadata* p = item.find(path);
      if (!p) {
        missing.push_back(path);
      } else {
        leaves.emplace_back(path, p);
      }
    }
    if (!options.partial) {
      for (const auto& p : item.params) {
        if (!target->contains(p.path) && p.value_type != "None" && p.value_type != "Dict" && p.value_type != "List" &&
            p.value_type != "Tuple" && p.value_type != "NamedTuple") {
          extra.push_back(p.path);
        }
      }
    }
    if (!missing.empty() || !extra.empty()) {
      std::string msg = "the checkpoint '" + item_dir.string() + "' and the target differ:";
      if (!missing.empty()) msg += "\nin the target but not in the checkpoint (" + std::to_string(missing.size()) + "):" + join_list(missing);
      if (!extra.empty()) {
        msg += "\nin the checkpoint but not in the target (" + std::to_string(extra.size()) + "):" + join_list(extra) +
               "\n(restore with partial to take only the target's leaves)";
      }
      throw ValueError(msg);
    }
  } else {
    if (options.fallback == Placement::kTarget) {
      throw ValueError("restoring '" + item_dir.string() + "' without a target needs Placement::kAsSaved or kReplicated");
    }
    for (const auto& p : item.params) {
      if (p.value_type == "jax.Array" || p.value_type == "np.ndarray" || p.value_type == "scalar" || p.value_type == "Unknown") {
        leaves.emplace_back(p.path, &p);
      }
    }
  }

  std::vector<LeafRead> plans;
  for (const auto& [path, meta] : leaves) {
    ZarrArray z = open_zarr(store, item_dir, item, *meta);
    const Variable* want = target ? &target->at(path) : nullptr;
    if (want && want->shape() != z.shape()) {
      throw ValueError("'" + path + "': the checkpoint holds " + type_string(z.dtype(), z.shape()) + ", the target wants " +
                       type_string(want->dtype(), want->shape()));
    }
    NamedSharding sharding = want && want->sharding() ? *want->sharding() : fallback_sharding(rt, *meta, z.shape(), options);
    rt.check_mesh(sharding.mesh());
    const DType dtype = want ? want->dtype() : z.dtype();
    const bool allow_missing = !item.store_array_data_equal_to_fill_value && z.fill_value().has_value();
    LeafRead plan{{path, meta, &store, key_prefix(*meta), z}, dtype, allow_missing, nullptr, {}, want ? want->kind() : meta->kind,
                   want && !want->partitioning().empty() ? want->partitioning() : meta->partitioning};
    plan.builder = std::make_unique<detail::ArrayBuilder>(rt, z.shape(), dtype, sharding, path);
    plans.push_back(std::move(plan));
  }
  // Target buffers: the only device memory a restore takes. Sizes from a corrupt file must not
  // reach the allocator, so the total is checked against the machine first.
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
  // Blocks whose uncompressed chunks lie side by side in them map them (their pages read in, the
  // I/O in parallel); every other block gets fresh memory and is read below.
  std::vector<MappedBlock> candidates;
  if (options.map_chunks) {
    for (size_t pi = 0; pi < plans.size(); ++pi) mappable_blocks(plans[pi], pi, candidates);
  }
  const int readers = default_threads(options.readers, 2);
  run_parallel(static_cast<int64_t>(candidates.size()), readers, [&](int64_t t) {
    MappedBlock& m = candidates[static_cast<size_t>(t)];
    map_block(plans[m.param], m);
  });
  struct MappedChunk {
    size_t candidate, chunk;
    bool cached;  // every page in the page cache already
  };
  std::vector<MappedChunk> mapped_chunks;
  bool all_cached = true;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (!candidates[c].bytes) continue;
    for (size_t k = 0; k < candidates[c].chunks.size(); ++k) {
      const bool cached = detail::resident(candidates[c].chunk(k, plans[candidates[c].param].zarr.chunk_bytes()));
      mapped_chunks.push_back({c, k, cached});
      all_cached = all_cached && cached;
    }
  }
  // Cached, populating the mappings is the cores' work; reading chunks in mostly waits on the
  // disk, and more threads than cores keep more of it busy (2 cores, 2 GiB in 16 MiB chunk files,
  // 4 cold rounds: 8 threads 1.71 to 2.00 GB/s, 4 threads 1.40 to 1.88; OCDBT's 4 data files
  // 1.70 to 1.82 and 1.72 to 1.93).
  const int map_threads = all_cached ? readers : default_threads(options.readers, 8);
  run_parallel(static_cast<int64_t>(mapped_chunks.size()), map_threads, [&](int64_t t) {
    const MappedChunk& m = mapped_chunks[static_cast<size_t>(t)];
    check_mapped_chunk(plans[candidates[m.candidate].param], candidates[m.candidate], m.chunk, m.cached,
                       options.verify_checksums);
  });
  int64_t bytes_mapped = 0, chunks_mapped = 0;
  for (MappedBlock& m : candidates) {
    if (!m.bytes) continue;
    bytes_mapped += m.bytes->size();
    chunks_mapped += static_cast<int64_t>(m.chunks.size());
    plans[m.param].builder->adopt(m.shard, std::move(*m.bytes));
  }
  // Local replicas of a block share its buffer: written once, stored once, each device charged.
  for (auto& p : plans) {
    p.builder->share_local_replicas();
    p.builder->allocate_all();
  }
  // One destination per distinct local block not mapped, and one task per chunk that some
  // destination needs, listing every such destination.
  std::vector<ReadTask> tasks;
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    LeafRead& p = plans[pi];
    for (size_t i = 0; i < p.builder->size(); ++i) {
      const Shard& s = p.builder->shard(i);
      if (!p.builder->fills(i) || s.box.empty()) continue;
      p.dests.push_back({p.builder->data(i), s.box});
    }
    std::map<std::vector<int64_t>, size_t> by_chunk;
    for (size_t d = 0; d < p.dests.size(); ++d) {
      for (auto& index : p.zarr.chunks_in(p.dests[d].box)) {
        auto [it, fresh] = by_chunk.emplace(index, tasks.size());
        if (fresh) tasks.push_back({pi, index, {}});
        tasks[it->second].dests.push_back(d);
      }
    }
  }
  // Half of the staging budget for the workers' reusable buffers (two each), half for leases.
  const int threads = static_cast<int>(std::min<int64_t>(readers, std::max<size_t>(tasks.size(), 1)));
  const int64_t budget = std::max<int64_t>(options.staging_bytes, 2);
  StagingBudget staging(budget / 2);
  std::vector<WorkerBuffers> buffers(static_cast<size_t>(threads));
  for (auto& b : buffers) b.keep = static_cast<size_t>(budget / 4 / threads);
  Counters counters;
  counters.bytes += bytes_mapped;
  counters.chunks += chunks_mapped;
  run_parallel(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t, int worker) {
    if (t + threads < static_cast<int64_t>(tasks.size())) {
      const ReadTask& next = tasks[static_cast<size_t>(t + threads)];
      will_need(plans[next.param], next.index);
    }
    const ReadTask& task = tasks[static_cast<size_t>(t)];
    run_task(plans[task.param], task, staging, buffers[static_cast<size_t>(worker)], options.verify_checksums, counters);
  });
  int64_t kept = 0;
  for (const auto& b : buffers) kept += static_cast<int64_t>(b.stored.size() + b.decoded.size());
  State out;
  for (auto& p : plans) out.insert(p.path, Variable(p.kind, std::move(*p.builder).finish(), p.partitioning));
  if (stats) {
    stats->bytes_read = counters.bytes;
    stats->chunks_read = counters.chunks;
    stats->bytes_mapped = bytes_mapped;
    stats->target_bytes = target_bytes;
    stats->staging_peak = staging.peak() + kept;
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

}  // namespace

State restore(const Runtime& rt, const fs::path& item_dir, const State& target, const RestoreOptions& options,
              RestoreStats* stats) {
  return restore_impl(rt, item_dir, &target, options, stats);
}

State restore(const Runtime& rt, const fs::path& item_dir, const RestoreOptions& options, RestoreStats* stats) {
  return restore_impl(rt, item_dir, nullptr, options, stats);
}

}  // namespace tessel
