#include "tessel/checkpoint/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include <unistd.h>

#include "tessel/checkpoint/detail/crc32c.h"
#include "tessel/checkpoint/detail/file_io.h"
#include "tessel/checkpoint/detail/item_io.h"
#include "tessel/checkpoint/detail/kvstore.h"
#include "tessel/checkpoint/detail/metadata_writer.h"
#include "tessel/checkpoint/zarr.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/detail/kernels.h"

namespace tessel {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Staging

struct StagedState::Impl {
  struct Block {
    Box box;
    std::span<const std::byte> bytes;
  };
  struct Param {
    std::string path;
    std::string kind;
    Partitioning partitioning;
    Shape shape;
    DType dtype = DType::kF32;
    NamedSharding sharding;
    std::vector<Block> blocks;  // this process's replica-0 blocks
  };
  std::vector<Param> params;
  std::optional<Runtime> runtime;             // of the arrays; none for an empty state
  std::vector<std::vector<std::byte>> owned;  // the host copies the blocks point into (staged)
  std::vector<Array> held;                    // or the arrays themselves (synchronous save)
  int64_t bytes = 0;
};

StagedState::StagedState() : impl_(std::make_unique<Impl>()) {}
StagedState::~StagedState() = default;
StagedState::StagedState(StagedState&&) noexcept = default;
StagedState& StagedState::operator=(StagedState&&) noexcept = default;
int64_t StagedState::bytes() const { return impl_->bytes; }

namespace {

int default_threads(int requested, int floor) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(cores, floor, 16);
}

// Runs fn(i), or fn(i, worker) with worker in [0, threads), for i in [0, n) on `threads`
// threads; rethrows the first failure after all stop.
template <class Fn>
void run_parallel(int64_t n, int threads, Fn&& fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&](int worker) {
    for (int64_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        if constexpr (std::is_invocable_v<Fn&, int64_t, int>) {
          fn(i, worker);
        } else {
          fn(i);
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const int extra = static_cast<int>(std::min<int64_t>(threads, n)) - 1;
  std::vector<std::thread> pool;
  for (int t = 0; t < extra; ++t) pool.emplace_back(work, t + 1);
  work(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    keys.push_back(path.substr(start, slash - start));
    if (slash == std::string::npos) return keys;
    start = slash + 1;
  }
}

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
        s.owned.emplace_back(bytes.begin(), bytes.end());
        bytes = s.owned.back();
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

// ---------------------------------------------------------------------------------------------
// Save

namespace detail {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

fs::path begin_tmp_dir(const fs::path& final_dir) {
  fs::path tmp = final_dir;
  tmp += kTmpSuffix;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) throw IoError("cannot remove the stale '" + tmp.string() + "': " + ec.message());
  if (!fs::create_directory(tmp, ec) || ec) {
    throw IoError("cannot create '" + tmp.string() + "': " + (ec ? ec.message() : "it exists"));
  }
  return tmp;
}

void commit_tmp_dir(const fs::path& tmp, const fs::path& final_dir, bool durable) {
  write_file(tmp / kCommitFile, "Checkpoint commit was successful to " + final_dir.string(), durable);
  if (durable) sync_directory(tmp);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) throw IoError("cannot commit '" + final_dir.string() + "': it already exists");
  fs::rename(tmp, final_dir, ec);
  if (ec) throw IoError("cannot rename '" + tmp.string() + "' to '" + final_dir.string() + "': " + ec.message());
  if (durable) sync_directory(final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path());
}

namespace {

// Where a save puts the item's keys (`<name>/.zarray`, `<name>/0.1`, `<name>/c/0/1`): plain files
// below the item directory, or this process's OCDBT database, `ocdbt.process_<N>/`, which
// finish() merges into the item's root database as Orbax does. put() may run in parallel.
class ItemWriter {
 public:
  ItemWriter(const fs::path& item_dir, const SaveOptions& options, int process)
      : dir_(item_dir), durable_(options.durable) {
    if (options.use_ocdbt) ocdbt_.emplace(item_dir / process_db(process), ocdbt_options(options));
  }
  static std::string process_db(int process) { return "ocdbt.process_" + std::to_string(process); }
  static OcdbtWriteOptions ocdbt_options(const SaveOptions& options) {
    OcdbtWriteOptions o;
    o.durable = options.durable;
    return o;
  }

  // Creates the directories a plain key needs (before the parallel puts).
  void prepare(const std::string& key) {
    if (ocdbt_) return;
    fs::path dir = dir_;
    const std::vector<std::string> parts = split_path(key);
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      dir = detail::child_path(dir, parts[i], "stored key");
      if (dirs_.insert(dir).second) {
        std::error_code ec;
        fs::create_directory(dir, ec);
        if (ec) throw IoError("cannot create '" + dir.string() + "': " + ec.message());
      }
    }
  }

  void put(const std::string& key, std::span<const std::byte> bytes) {
    if (ocdbt_) {
      ocdbt_->put(key, bytes);
      return;
    }
    detail::File f = detail::File::create(dir_ / key);
    f.write_all(bytes);
    if (durable_) f.sync();
    f.close();
  }

  // This process's keys are durable; the item's root database is still to be merged.
  void finish() {
    if (ocdbt_) {
      ocdbt_->commit();
    } else if (durable_) {
      for (const auto& d : dirs_) detail::sync_directory(d);
    }
  }

 private:
  fs::path dir_;
  bool durable_;
  std::optional<OcdbtWriter> ocdbt_;
  std::set<fs::path> dirs_;
};

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A zarr3 shard holding one inner chunk, as Orbax writes them: the chunk's bytes, then the index
// (offset 0, its length) and the index's CRC-32C.
std::vector<std::byte> one_chunk_shard(std::span<const std::byte> chunk) {
  std::vector<std::byte> shard(chunk.begin(), chunk.end());
  std::byte index[20];
  const uint64_t offset = 0, length = chunk.size();
  std::memcpy(index, &offset, 8);
  std::memcpy(index + 8, &length, 8);
  const uint32_t crc = detail::crc32c(std::span<const std::byte>(index, 16));
  std::memcpy(index + 16, &crc, 4);
  shard.insert(shard.end(), index, index + 20);
  return shard;
}

}  // namespace

namespace {

// What every process derives alike from the staged state: each parameter's stored name, chunking
// and zarr metadata.
struct ItemLayout {
  std::vector<ParamRecord> records;
  std::vector<ZarrArray> zarrs;
};

ItemLayout layout_of(const fs::path& item_dir, const StagedState& staged, const SaveOptions& options) {
  static_assert(std::endian::native == std::endian::little, "stored indexes are little endian");
  if (options.max_chunk_bytes < 1) throw ValueError("max_chunk_bytes must be positive");
  if (options.compression.kind == Compression::Kind::kBlosc) {
    throw ValueError("tessel does not write blosc chunks; use none or zstd");
  }
  ItemLayout out;
  std::map<std::string, std::string> names;  // stored name -> path
  for (const auto& p : staged.impl().params) {
    ParamRecord r{p.path, split_path(p.path), {}, {}, {}, {}, p.sharding, p.kind, p.partitioning, {}};
    std::string node;  // the path of the node each key belongs to
    for (size_t i = 0; i < r.keys.size(); ++i) {
      r.name += (i ? "." : "") + r.keys[i];
      r.key_types.push_back(options.sequence_nodes.contains(node) ? kSequenceKey : kDictKey);
      node += (i ? "/" : "") + r.keys[i];
    }
    if (auto [it, fresh] = names.emplace(r.name, p.path); !fresh) {
      throw ValueError("cannot save both '" + it->second + "' and '" + p.path + "': both would be stored as '" +
                       r.name + "' (Orbax joins path keys with '.')");
    }
    child_path(item_dir, r.name, "parameter name");
    r.write_shape = p.sharding.shard_shape(p.shape);
    std::vector<size_t> sharded;
    for (size_t d = 0; d < p.shape.rank(); ++d) {
      if (p.sharding.num_blocks(d) > 1) sharded.push_back(d);
    }
    r.chunk_shape = choose_chunk_shape(r.write_shape, item_size(p.dtype), options.max_chunk_bytes, sharded);
    if (options.use_zarr3) {
      out.zarrs.push_back(ZarrArray::sharded_v3(p.shape, r.chunk_shape, r.chunk_shape, p.dtype, options.compression));
    } else {
      out.zarrs.emplace_back(p.shape, r.chunk_shape, p.dtype, options.compression);
    }
    out.records.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::string write_item_blocks(const fs::path& item_dir, const StagedState& staged, const SaveOptions& options,
                              int process) {
  const auto& params = staged.impl().params;
  ItemLayout layout = layout_of(item_dir, staged, options);
  auto& records = layout.records;
  const auto& zarrs = layout.zarrs;
  // One task per chunk of every written block.
  struct Task {
    size_t param;
    size_t block;
    std::vector<int64_t> index;
  };
  std::vector<Task> tasks;
  ItemWriter out(item_dir, options, process);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string prefix = records[i].name + "/";
    if (process == 0) {
      const std::string meta_key = prefix + zarrs[i].metadata_key();
      out.prepare(meta_key);
      out.put(meta_key, as_bytes(zarrs[i].to_json()));
    }
    for (size_t b = 0; b < params[i].blocks.size(); ++b) {
      for (auto& index : zarrs[i].chunks_in(params[i].blocks[b].box)) {
        out.prepare(prefix + zarrs[i].chunk_key(index));
        tasks.push_back({i, b, std::move(index)});
      }
    }
  }
  std::mutex mu;
  run_parallel(static_cast<int64_t>(tasks.size()), default_threads(options.writers, 4), [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    const auto& p = params[task.param];
    const ZarrArray& z = zarrs[task.param];
    const auto& block = p.blocks[task.block];
    const Box chunk = z.chunk_box(task.index);
    const size_t item = item_size(p.dtype);
    std::span<const std::byte> raw;
    std::vector<std::byte> gathered;
    if (chunk == block.box) {
      raw = block.bytes;  // the usual case: the chunk is the shard, written straight from it
    } else {
      // A sub-chunk of a large shard, or an edge chunk (zarr stores it padded to the full shape).
      gathered.assign(static_cast<size_t>(z.chunk_bytes()), std::byte{0});
      const Box region = chunk.intersect(block.box);
      copy_region(block.bytes.data(), block.box, gathered.data(), chunk, region, item);
      raw = gathered;
    }
    std::vector<std::byte> packed;
    if (options.compression.kind != Compression::Kind::kNone) {
      packed = compress(options.compression, raw);
      raw = packed;
    }
    // The checksum covers the chunk's stored bytes, which a restore reads (a shard's index aside).
    const uint32_t crc = crc32c(raw);
    std::vector<std::byte> shard;
    if (z.sharded()) {
      shard = one_chunk_shard(raw);
      raw = shard;
    }
    const std::string key = z.chunk_key(task.index);
    out.put(records[task.param].name + "/" + key, raw);
    std::lock_guard lock(mu);
    records[task.param].crc32c[key] = crc;
  });
  out.finish();
  nlohmann::json crcs = nlohmann::json::object();
  for (const ParamRecord& r : records) {
    if (!r.crc32c.empty()) crcs[r.name] = r.crc32c;
  }
  return crcs.dump();
}

void finish_item(const fs::path& item_dir, const StagedState& staged, const SaveOptions& options,
                 const std::vector<std::string>& crcs) {
  const auto& params = staged.impl().params;
  ItemLayout layout = layout_of(item_dir, staged, options);
  std::map<std::string, ParamRecord*> by_name;
  for (ParamRecord& r : layout.records) by_name[r.name] = &r;
  for (size_t process = 0; process < crcs.size(); ++process) {
    const std::string what = "the chunk checksums of process " + std::to_string(process);
    const nlohmann::json j = json_util::parse(crcs[process], what);
    for (const auto& [name, chunks] : j.items()) {
      auto it = by_name.find(name);
      if (it == by_name.end()) throw ValueError(what + " name '" + name + "', which this process does not save");
      for (const auto& [key, crc] : chunks.items()) it->second->crc32c[key] = crc.get<uint32_t>();
    }
  }
  if (options.use_ocdbt) {
    std::vector<std::string> dbs;
    for (size_t process = 0; process < crcs.size(); ++process) dbs.push_back(ItemWriter::process_db(static_cast<int>(process)));
    merge_ocdbt(item_dir, dbs, ItemWriter::ocdbt_options(options));
  }
  const auto& records = layout.records;
  const Mesh mesh = params.empty() ? Mesh({}) : params.front().sharding.mesh();
  write_file(item_dir / "_sharding", sharding_json(records), options.durable);
  fs::create_directory(item_dir / "array_metadatas");
  write_file(item_dir / "array_metadatas" / "process_0", array_metadatas_json(records), options.durable);
  if (options.durable) sync_directory(item_dir / "array_metadatas");
  write_file(item_dir / "_METADATA", tree_metadata_json(records, mesh, options.rules, options.use_ocdbt, options.use_zarr3),
             options.durable);
  if (options.durable) sync_directory(item_dir);
}

ProcessGroup& processes_of(const StagedState& staged) {
  static SingleProcessGroup one;
  const auto& rt = staged.impl().runtime;
  return rt ? rt->processes() : one;
}

}  // namespace detail

void save(const fs::path& dir, const StagedState& staged, const SaveOptions& options) {
  ProcessGroup& group = detail::processes_of(staged);
  const std::string where = "saving '" + dir.string() + "'";
  const int64_t init = detail::now_ns();
  const fs::path tmp = fs::path(dir) += detail::kTmpSuffix;
  run_together(group, where, [&] {
    if (!group.is_leader()) return;
    std::error_code ec;
    if (fs::exists(dir, ec)) throw IoError("cannot save to '" + dir.string() + "': it already exists");
    detail::begin_tmp_dir(dir);
  });
  try {
    const std::vector<std::string> crcs = gather_together(
        group, where, [&] { return detail::write_item_blocks(tmp, staged, options, group.index()); });
    run_together(group, where, [&] {
      if (!group.is_leader()) return;
      detail::finish_item(tmp, staged, options, crcs);
      detail::write_file(tmp / detail::kCheckpointMetadata, detail::checkpoint_metadata_json({}, init, detail::now_ns()),
                         options.durable);
      detail::commit_tmp_dir(tmp, dir, options.durable);
    });
  } catch (...) {
    std::error_code ec;
    if (group.is_leader()) fs::remove_all(tmp, ec);  // best effort: a crash instead leaves it for the next cleanup
    throw;
  }
}

StagedState detail::stage_in_place(const State& state) {
  StagedState staged;
  const_cast<StagedState::Impl&>(staged.impl()) = stage_impl(state, /*copy=*/false);
  return staged;
}

void save(const fs::path& dir, const State& state, const SaveOptions& options) {
  save(dir, detail::stage_in_place(state), options);
}

// ---------------------------------------------------------------------------------------------
// Restore

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

// The most stored bytes a compressed chunk of `chunk_bytes` may have: anything larger is not one
// of this array's chunks, and is refused before it is read.
int64_t max_stored_bytes(int64_t chunk_bytes) { return chunk_bytes + chunk_bytes / 8 + (int64_t{1} << 20); }

// One local block of a leaf: `data` is written from the chunks, `replicas` (other local copies
// of the same block) receive the same bytes while they are still in cache.
struct Destination {
  std::byte* data;
  Box box;
  std::vector<std::byte*> replicas;
};

// Copies `bytes` at byte offset `at` of a destination's block into its other local replicas.
void copy_to_replicas(const Destination& dst, int64_t at, size_t bytes) {
  for (std::byte* r : dst.replicas) std::memcpy(r + at, dst.data + at, bytes);
}

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

struct LeafRead {
  std::string path;
  const ParamMetadata* meta;
  const detail::KvStore* store;
  std::string prefix;  // the parameter's keys start with it: "<name>/"
  ZarrArray zarr;
  DType target_dtype;
  bool allow_missing;  // absent chunks take the fill value
  std::unique_ptr<detail::ArrayBuilder> builder;
  std::vector<Destination> dests;
  std::string kind;
  Partitioning partitioning;
};

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

std::string chunk_what(const LeafRead& p, const std::string& key) {
  return "'" + p.path + "' chunk " + key + " (" + p.store->describe(p.prefix + key) + ")";
}

// Compares a chunk's CRC-32C with the saved one, when the checkpoint has it.
void check_crc(const LeafRead& p, const std::string& key, uint32_t crc) {
  auto it = p.meta->crc32c.find(key);
  if (it != p.meta->crc32c.end() && crc != it->second) {
    throw ValueError(chunk_what(p, key) + ": CRC-32C mismatch (the chunk is corrupt)");
  }
}

// The stored bytes of chunk `index`: a whole value, or its part of a zarr3 shard (found through
// the shard's index, whose CRC-32C is checked). nullopt when the chunk was never written.
std::optional<detail::StoredValue> locate_chunk(const LeafRead& p, std::span<const int64_t> index, const std::string& key) {
  std::optional<detail::StoredValue> value = p.store->get(p.prefix + key);
  if (!value || !p.zarr.sharded()) return value;
  const ZarrArray& z = p.zarr;
  const int64_t index_bytes = z.shard_index_bytes();
  if (value->size() < index_bytes) {
    throw ValueError(chunk_what(p, key) + ": a shard of " + std::to_string(value->size()) + " bytes cannot hold its index of " +
                     std::to_string(index_bytes));
  }
  std::vector<std::byte> table(static_cast<size_t>(index_bytes));
  value->read(z.index_at_end() ? value->size() - index_bytes : 0, table);
  const int64_t pos = z.position_in_shard(index);
  const auto range = z.inner_chunk_range(table, pos, value->size(), chunk_what(p, key));
  if (!range) return std::nullopt;
  return value->slice(range->offset, range->length,
                      chunk_what(p, key) + " inner chunk " + std::to_string(pos));
}

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
      copy_to_replicas(dst, t * out, static_cast<size_t>(n) * out);
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
      copy_to_replicas(dst, t * static_cast<int64_t>(item), static_cast<size_t>(n) * item);
    });
  }
}

struct Counters {
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> chunks{0};
};

// An uncompressed chunk of the target dtype: each destination's runs are read straight into its
// buffer, consecutive file runs in one preadv of at most kSlabBytes, so that the replica copies
// and the checksum that follow each read find the bytes in cache.
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
        copy_to_replicas(dst, at - dst.data, v.iov_len);
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

// True when the destinations need most of the chunk in short pieces (a column block out of
// row-major chunks): then reading the chunk once, slab by slab, beats one read per piece.
bool small_runs(const LeafRead& p, const Box& chunk, const ReadTask& task) {
  int64_t runs = 0, elements = 0;
  for (size_t d : task.dests) {
    const Box region = chunk.intersect(p.dests[d].box);
    elements += region.volume();
    for_each_run(region, chunk, p.dests[d].box, [&](int64_t, int64_t, int64_t) { ++runs; });
  }
  const int64_t bytes = elements * static_cast<int64_t>(item_size(p.zarr.dtype()));
  return runs > 64 && bytes / runs < (int64_t{64} << 10) && 2 * bytes >= p.zarr.chunk_bytes();
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

// zarr3's crc32c codec: the chunk's bytes end in their CRC-32C, checked and cut off.
std::span<const std::byte> strip_chunk_crc(const LeafRead& p, const std::string& key, std::span<const std::byte> stored) {
  if (!p.zarr.chunk_checksum()) return stored;
  if (stored.size() < 4) throw ValueError(chunk_what(p, key) + ": too short for its CRC-32C");
  uint32_t crc = 0;
  std::memcpy(&crc, stored.data() + stored.size() - 4, 4);
  const auto body = stored.first(stored.size() - 4);
  if (detail::crc32c(body) != crc) throw ValueError(chunk_what(p, key) + ": CRC-32C mismatch (the chunk is corrupt)");
  return body;
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
    copy_to_replicas(*whole, 0, out.size());
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

std::string key_prefix(const ParamMetadata& p) { return p.name.empty() ? std::string() : p.name + "/"; }

// The parameter's zarr metadata: `.zarray` or `zarr.json` (the one _METADATA announces first).
ZarrArray open_zarr(const detail::KvStore& store, const fs::path& item_dir, const ItemMetadata& item,
                    const ParamMetadata& p) {
  if (!store.is_ocdbt()) detail::reject_symlink(detail::child_path(item_dir, p.name, "parameter name"));
  const std::string prefix = key_prefix(p);
  std::string key;
  std::optional<std::string> text;
  if (!p.skip_deserialize) {
    for (const char* name : item.use_zarr3 ? std::array{"zarr.json", ".zarray"} : std::array{".zarray", "zarr.json"}) {
      key = prefix + name;
      text = store.get_small(key, int64_t{1} << 20);
      if (text) break;
    }
  }
  if (!text) {
    if (p.skip_deserialize || fs::exists(item_dir / "checkpoint")) {
      throw ValueError("'" + p.path + "' is not stored as a zarr array in '" + item_dir.string() +
                       "' (an Orbax aggregate msgpack value, which tessel does not read); restore the other "
                       "leaves with partial");
    }
    throw ValueError("'" + p.path + "' has no array data: neither " + store.describe(prefix + ".zarray") + " nor " +
                     store.describe(prefix + "zarr.json") + " exists");
  }
  ZarrArray z = ZarrArray::parse(*text, store.describe(key));
  if (p.write_shape && p.write_shape->rank() != z.shape().rank()) {
    throw ValueError("'" + p.path + "': _METADATA gives write_shape " + p.write_shape->to_string() + " but " + key +
                     " has shape " + z.shape().to_string());
  }
  return z;
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
    LeafRead plan{path, meta, &store, key_prefix(*meta), z, dtype, allow_missing, nullptr, {}, want ? want->kind() : meta->kind,
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
  for (auto& p : plans) p.builder->allocate_all();
  // One destination per distinct local block (its other local copies ride along as replicas), and
  // one task per chunk that some destination needs, listing every such destination.
  std::vector<ReadTask> tasks;
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    LeafRead& p = plans[pi];
    std::map<std::vector<int64_t>, size_t> by_block;  // block start -> destination
    for (size_t i = 0; i < p.builder->size(); ++i) {
      const Shard& s = p.builder->shard(i);
      if (!p.builder->addressable(i) || s.box.empty()) continue;
      auto [it, fresh] = by_block.emplace(std::vector<int64_t>(s.box.starts().begin(), s.box.starts().end()), p.dests.size());
      if (fresh) {
        p.dests.push_back({p.builder->data(i), s.box, {}});
      } else {
        p.dests[it->second].replicas.push_back(p.builder->data(i));
      }
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
  const int threads = static_cast<int>(std::min<int64_t>(default_threads(options.readers, 2), std::max<size_t>(tasks.size(), 1)));
  const int64_t budget = std::max<int64_t>(options.staging_bytes, 2);
  StagingBudget staging(budget / 2);
  std::vector<WorkerBuffers> buffers(static_cast<size_t>(threads));
  for (auto& b : buffers) b.keep = static_cast<size_t>(budget / 4 / threads);
  Counters counters;
  run_parallel(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t, int worker) {
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

// ---------------------------------------------------------------------------------------------
// Inspection

State saved_abstract_state(const fs::path& item_dir) {
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  State out;
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    ZarrArray z = open_zarr(store, item_dir, item, p);
    std::optional<NamedSharding> s;
    if (p.sharding) s = NamedSharding(p.sharding->mesh, p.sharding->spec);
    out.insert(p.path, Variable::abstract(p.kind, z.shape(), z.dtype(), s, p.partitioning));
  }
  return out;
}

std::vector<SavedArrayInfo> describe_item(const fs::path& item_dir) {
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  std::vector<SavedArrayInfo> out;
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    ZarrArray z = open_zarr(store, item_dir, item, p);
    SavedArrayInfo info{p, z.shape(), z.dtype(), z.chunks(), z.compression(), z.num_chunks(), 0};
    std::set<std::string> keys;  // a zarr3 shard holds several chunks
    for (const auto& index : z.chunks_in(Box::full(z.shape()))) keys.insert(z.chunk_key(index));
    for (const auto& key : keys) {
      if (const auto v = store.get(key_prefix(p) + key)) info.stored_bytes += v->size();
    }
    out.push_back(std::move(info));
  }
  return out;
}

VerifyReport verify(const fs::path& item_dir) {
  VerifyReport report;
  const ItemMetadata item = read_item_metadata(item_dir);
  const detail::KvStore store = detail::KvStore::open(item_dir);
  for (const auto& p : item.params) {
    if (p.skip_deserialize) continue;
    report.arrays += 1;
    std::optional<ZarrArray> z;
    try {
      z = open_zarr(store, item_dir, item, p);
    } catch (const Error& e) {
      report.faults.push_back(e.what());
      continue;
    }
    LeafRead plan{p.path, &p, &store, key_prefix(p), *z, z->dtype(), false, nullptr, {}, p.kind, p.partitioning};
    for (const auto& index : z->chunks_in(Box::full(z->shape()))) {
      const std::string key = z->chunk_key(index);
      report.chunks += 1;
      try {
        const std::optional<detail::StoredValue> value = locate_chunk(plan, index, key);
        if (!value) {
          if (item.store_array_data_equal_to_fill_value || !z->fill_value()) {
            report.faults.push_back(chunk_what(plan, key) + " is missing");
          }
          continue;
        }
        const int64_t size = value->size();
        if (size > max_stored_bytes(z->chunk_bytes())) {
          report.faults.push_back(chunk_what(plan, key) + ": " + std::to_string(size) + " bytes, too many for a chunk of " +
                                  std::to_string(z->chunk_bytes()));
          continue;
        }
        std::vector<std::byte> stored(static_cast<size_t>(size));
        value->read(0, stored);
        report.bytes += size;
        auto it = p.crc32c.find(key);
        if (it != p.crc32c.end()) {
          report.checksums += 1;
          if (detail::crc32c(stored) != it->second) {
            report.faults.push_back(chunk_what(plan, key) + ": CRC-32C mismatch");
            continue;
          }
        }
        if (z->chunk_checksum()) report.checksums += 1;
        std::vector<std::byte> decoded(static_cast<size_t>(z->chunk_bytes()));
        decompress(z->compression(), strip_chunk_crc(plan, key, stored), decoded, chunk_what(plan, key));
      } catch (const Error& e) {
        report.faults.push_back(e.what());
      }
    }
  }
  return report;
}

}  // namespace tessel
