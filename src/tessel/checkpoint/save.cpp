// Saving a State as an Orbax PyTree item: every process writes its blocks as whole chunks, the
// leader merges the OCDBT databases, writes the metadata and commits by renaming.
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/item_io.h"
#include "tessel/checkpoint/detail/store/kvstore.h"
#include "tessel/checkpoint/detail/metadata_writer.h"
#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/staged_state.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/path.h"
#include "tessel/detail/json_util.h"
#include "tessel/runtime/process_group.h"

namespace tessel {
namespace fs = std::filesystem;
using detail::default_threads;
using detail::run_parallel;
using detail::split_path;

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
    if (durable_) f.enable_direct_writes();  // the bytes go to the disk now anyway (see File)
    f.write_at(0, bytes);
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

// Orbax's key type of each key: a sequence index under the sequence nodes, else a dict key.
std::vector<int> key_types(const std::vector<std::string>& keys, const SaveOptions& options) {
  std::vector<int> out;
  std::string node;  // the path of the node each key belongs to
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(options.sequence_nodes.contains(node) ? kSequenceKey : kDictKey);
    node += (i ? "/" : "") + keys[i];
  }
  return out;
}

std::vector<EmptyNode> empty_nodes_of(const SaveOptions& options) {
  std::vector<EmptyNode> out;
  for (const std::string& path : options.empty_nodes) {
    std::vector<std::string> keys = split_path(path);
    std::vector<int> types = key_types(keys, options);
    out.push_back({std::move(keys), std::move(types)});
  }
  return out;
}

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
    r.key_types = key_types(r.keys, options);
    for (size_t i = 0; i < r.keys.size(); ++i) r.name += (i ? "." : "") + r.keys[i];
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

namespace {

// Writes every chunk of `p`'s blocks (this process's) through `out`, in parallel, recording each
// chunk's CRC-32C in `record`.
void write_chunks(ItemWriter& out, const StagedState::Impl::Param& p, const ZarrArray& z, ParamRecord& record,
                  const SaveOptions& options) {
  struct Task {
    size_t block;
    std::vector<int64_t> index;
  };
  std::vector<Task> tasks;
  const std::string prefix = record.name + "/";
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    for (auto& index : z.chunks_in(p.blocks[b].box)) {
      out.prepare(prefix + z.chunk_key(index));
      tasks.push_back({b, std::move(index)});
    }
  }
  std::mutex mu;
  run_parallel(static_cast<int64_t>(tasks.size()), default_threads(options.writers, 4), [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    const auto& block = p.blocks[task.block];
    const Box chunk = z.chunk_box(task.index);
    const size_t item = item_size(p.dtype);
    std::span<const std::byte> raw;
    std::vector<std::byte> gathered;
    if (chunk == block.box) {
      raw = block.bytes;  // the usual case: the chunk is the shard, written straight from it
    } else if (const auto first = block.box.run_offset(chunk)) {
      raw = block.bytes.subspan(static_cast<size_t>(*first * static_cast<int64_t>(item)),
                                static_cast<size_t>(chunk.volume() * static_cast<int64_t>(item)));  // one run of it
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
    out.put(prefix + key, raw);
    std::lock_guard lock(mu);
    record.crc32c[key] = crc;
  });
}

void put_zarr_metadata(ItemWriter& out, const ParamRecord& r, const ZarrArray& z) {
  const std::string key = r.name + "/" + z.metadata_key();
  out.prepare(key);
  out.put(key, as_bytes(z.to_json()));
}

// The item's metadata files, once every process's chunks (and databases) are in place.
void write_item_metadata(const fs::path& item_dir, const std::vector<ParamRecord>& records, const Mesh& mesh,
                         const SaveOptions& options) {
  write_file(item_dir / "_sharding", sharding_json(records), options.durable);
  fs::create_directory(item_dir / "array_metadatas");
  write_file(item_dir / "array_metadatas" / "process_0", array_metadatas_json(records), options.durable);
  if (options.durable) sync_directory(item_dir / "array_metadatas");
  write_file(item_dir / "_METADATA", tree_metadata_json(records, empty_nodes_of(options), mesh, options.rules, options.use_ocdbt,
                                                       options.use_zarr3),
             options.durable);
  if (options.durable) sync_directory(item_dir);
}

}  // namespace

std::string write_item_blocks(const fs::path& item_dir, const StagedState& staged, const SaveOptions& options,
                              int process) {
  const auto& params = staged.impl().params;
  ItemLayout layout = layout_of(item_dir, staged, options);
  ItemWriter out(item_dir, options, process);
  for (size_t i = 0; i < params.size(); ++i) {
    if (process == 0) put_zarr_metadata(out, layout.records[i], layout.zarrs[i]);
    write_chunks(out, params[i], layout.zarrs[i], layout.records[i], options);
  }
  out.finish();
  nlohmann::json crcs = nlohmann::json::object();
  for (const ParamRecord& r : layout.records) {
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
  write_item_metadata(item_dir, layout.records, params.empty() ? Mesh({}) : params.front().sharding.mesh(), options);
}

ProcessGroup& processes_of(const StagedState& staged) {
  static SingleProcessGroup one;
  const auto& rt = staged.impl().runtime;
  return rt ? rt->processes() : one;
}

}  // namespace detail

void save(const fs::path& dir_arg, const StagedState& staged, const SaveOptions& options) {
  const fs::path dir = local_path(dir_arg.string(), "checkpoint directory");
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

void save(const fs::path& dir, const State& state, const SaveOptions& options) {
  save(dir, detail::stage_in_place(state), options);
}

// ---------------------------------------------------------------------------------------------
// Streaming

struct CheckpointWriter::Impl {
  fs::path dir, tmp;
  SaveOptions options;
  StagedState::Impl laid_out;  // every leaf's path, shape, dtype and sharding; no blocks
  detail::ItemLayout layout;
  std::map<std::string, size_t> index;
  std::vector<bool> written;
  std::optional<detail::ItemWriter> out;
  int64_t init_ns = 0;
  bool committed = false;
};

CheckpointWriter::CheckpointWriter(fs::path dir, const State& abstract, SaveOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.dir = local_path(dir.string(), "checkpoint directory");
  w.options = std::move(options);
  w.init_ns = detail::now_ns();
  for (const auto& [path, v] : abstract) {
    if (!v.sharding()) throw ValueError("'" + path + "' has no sharding: a checkpoint records each leaf's sharding");
    w.laid_out.params.push_back({path, v.kind(), v.partitioning(), v.shape(), v.dtype(), *v.sharding(), {}});
  }
  std::error_code ec;
  if (fs::exists(w.dir, ec)) throw IoError("cannot save to '" + w.dir.string() + "': it already exists");
  StagedState shapes;
  const_cast<StagedState::Impl&>(shapes.impl()).params = w.laid_out.params;
  w.tmp = detail::begin_tmp_dir(w.dir);
  w.layout = detail::layout_of(w.tmp, shapes, w.options);
  w.out.emplace(w.tmp, w.options, 0);
  for (size_t i = 0; i < w.layout.records.size(); ++i) {
    w.index[w.laid_out.params[i].path] = i;
    detail::put_zarr_metadata(*w.out, w.layout.records[i], w.layout.zarrs[i]);
  }
  w.written.assign(w.layout.records.size(), false);
}

CheckpointWriter::~CheckpointWriter() {
  if (impl_ && !impl_->committed && !impl_->tmp.empty()) {
    impl_->out.reset();
    std::error_code ec;
    fs::remove_all(impl_->tmp, ec);
  }
}

void CheckpointWriter::write(const std::string& path, const Array& array) {
  Impl& w = *impl_;
  auto it = w.index.find(path);
  if (it == w.index.end()) throw ValueError("'" + path + "' is not one of the leaves this writer laid out");
  const auto& p = w.laid_out.params[it->second];
  if (array.shape() != p.shape || array.dtype() != p.dtype || !(array.sharding() == p.sharding))
    throw ValueError("'" + path + "' is " + type_string(array.dtype(), array.shape()) + " " + array.sharding().to_string() +
                     ", laid out as " + type_string(p.dtype, p.shape) + " " + p.sharding.to_string());
  if (w.written[it->second]) throw ValueError("'" + path + "' is written twice");
  State one;
  one.insert(path, Variable(p.kind, array, p.partitioning));
  const StagedState staged = detail::stage_in_place(one);
  detail::write_chunks(*w.out, staged.impl().params.front(), w.layout.zarrs[it->second], w.layout.records[it->second],
                       w.options);
  w.written[it->second] = true;
}

void CheckpointWriter::commit() {
  Impl& w = *impl_;
  for (size_t i = 0; i < w.written.size(); ++i)
    if (!w.written[i]) throw ValueError("'" + w.laid_out.params[i].path + "' was never written");
  w.out->finish();
  w.out.reset();
  if (w.options.use_ocdbt)
    merge_ocdbt(w.tmp, {detail::ItemWriter::process_db(0)}, detail::ItemWriter::ocdbt_options(w.options));
  const auto& params = w.laid_out.params;
  detail::write_item_metadata(w.tmp, w.layout.records, params.empty() ? Mesh({}) : params.front().sharding.mesh(),
                              w.options);
  detail::write_file(w.tmp / detail::kCheckpointMetadata, detail::checkpoint_metadata_json({}, w.init_ns, detail::now_ns()),
                     w.options.durable);
  detail::commit_tmp_dir(w.tmp, w.dir, w.options.durable);
  w.committed = true;
}

}  // namespace tessel
