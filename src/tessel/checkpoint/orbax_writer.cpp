// Writing an Orbax PyTree item (CheckpointWriter): every process writes its blocks as whole
// chunks into its own OCDBT database or chunk files; the leader merges the databases, writes the
// metadata with every process's checksums and commits by renaming.
#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/output.h"
#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/metadata_writer.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/staged.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"

namespace tessel {
namespace fs = std::filesystem;
using detail::default_threads;
using detail::run_parallel;
using detail::split_path;

namespace detail {
namespace {

// Where a save puts the item's keys (`<name>/.zarray`, `<name>/0.1`, `<name>/c/0/1`): plain files
// below the item directory, or this process's OCDBT database, `ocdbt.process_<N>/`, which
// finish() merges into the item's root database as Orbax does. put() may run in parallel.
class KeyWriter {
 public:
  KeyWriter(OutputDir& item, const SaveOptions& options, int process) : out_(item) {
    if (options.use_ocdbt) ocdbt_.emplace(item.location() / process_db(process), ocdbt_options(options));
  }
  static std::string process_db(int process) { return "ocdbt.process_" + std::to_string(process); }
  static OcdbtWriteOptions ocdbt_options(const SaveOptions& options) {
    OcdbtWriteOptions o;
    o.durable = options.durable;
    return o;
  }

  void put(const std::string& key, std::span<const std::byte> bytes) {
    if (ocdbt_) {
      ocdbt_->put(key, bytes);
      return;
    }
    std::unique_ptr<OutputFile> f = out_.create(key);
    f->write_at(0, bytes);
    f->finish();
  }

  // This process's keys are durable; the item's root database is still to be merged.
  void finish() {
    if (ocdbt_) {
      ocdbt_->commit();
    } else {
      out_.sync();
    }
  }

 private:
  OutputDir& out_;
  std::optional<OcdbtWriter> ocdbt_;
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

ItemLayout layout_of(const State& abstract, const SaveOptions& options) {
  static_assert(std::endian::native == std::endian::little, "stored indexes are little endian");
  if (options.max_chunk_bytes < 1) throw ValueError("max_chunk_bytes must be positive");
  if (options.compression.kind == Compression::Kind::kBlosc) {
    throw ValueError("tessel does not write blosc chunks; use none or zstd");
  }
  ItemLayout out;
  std::map<std::string, std::string> names;  // stored name -> path
  for (const auto& [path, v] : abstract) {
    const NamedSharding& sharding = *v.sharding();
    ParamRecord r{path, split_path(path), {}, {}, {}, {}, sharding, v.kind(), v.partitioning(), {}};
    r.key_types = key_types(r.keys, options);
    for (size_t i = 0; i < r.keys.size(); ++i) r.name += (i ? "." : "") + r.keys[i];
    if (auto [it, fresh] = names.emplace(r.name, path); !fresh) {
      throw ValueError("cannot save both '" + it->second + "' and '" + path + "': both would be stored as '" +
                       r.name + "' (Orbax joins path keys with '.')");
    }
    child_path("item", r.name, "parameter name");  // a name the item directory can hold
    r.write_shape = sharding.shard_shape(v.shape());
    std::vector<size_t> sharded;
    for (size_t d = 0; d < v.shape().rank(); ++d) {
      if (sharding.num_blocks(d) > 1) sharded.push_back(d);
    }
    if (auto it = options.block_shapes.find(path); it != options.block_shapes.end()) {
      const Shape& block = it->second;
      bool fits = block.rank() == v.shape().rank();
      for (size_t d = 0; fits && d < block.rank(); ++d) fits = block[d] >= 1 && block[d] <= std::max<int64_t>(v.shape()[d], 1);
      if (!fits)
        throw ValueError("'" + path + "': block shape " + block.to_string() + " does not fit its shape " +
                         v.shape().to_string());
      r.write_shape = block;
      sharded.clear();
      for (size_t d = 0; d < block.rank(); ++d)
        if (block[d] < v.shape()[d]) sharded.push_back(d);
    }
    r.chunk_shape = choose_chunk_shape(r.write_shape, item_size(v.dtype()), options.max_chunk_bytes, sharded);
    if (options.use_zarr3) {
      out.zarrs.push_back(ZarrArray::sharded_v3(v.shape(), r.chunk_shape, r.chunk_shape, v.dtype(), options.compression));
    } else {
      out.zarrs.emplace_back(v.shape(), r.chunk_shape, v.dtype(), options.compression);
    }
    out.records.push_back(std::move(r));
  }
  return out;
}


// Writes every chunk of `p`'s blocks (this process's) through `out`, in parallel, recording each
// chunk's CRC-32C in `record`.
void write_chunks(KeyWriter& out, std::span<const HostBlock> blocks, DType dtype, const ZarrArray& z,
                  ParamRecord& record, const SaveOptions& options) {
  struct Task {
    size_t block;
    std::vector<int64_t> index;
  };
  std::vector<Task> tasks;
  const std::string prefix = record.name + "/";
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (auto& index : z.chunks_in(blocks[b].box)) {
      tasks.push_back({b, std::move(index)});
    }
  }
  std::mutex mu;
  run_parallel(static_cast<int64_t>(tasks.size()), default_threads(options.writers, 4), [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    const HostBlock& block = blocks[task.block];
    const Box chunk = z.chunk_box(task.index);
    const size_t item = item_size(dtype);
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

void put_zarr_metadata(KeyWriter& out, const ParamRecord& r, const ZarrArray& z) {
  const std::string key = r.name + "/" + z.metadata_key();
  out.put(key, as_bytes(z.to_json()));
}

// The item's metadata files, once every process's chunks (and databases) are in place.
void write_item_metadata(OutputDir& item, const std::vector<ParamRecord>& records, const Mesh& mesh,
                         const SaveOptions& options) {
  item.write("_sharding", sharding_json(records));
  item.write("array_metadatas/process_0", array_metadatas_json(records));
  item.write("_METADATA", tree_metadata_json(records, empty_nodes_of(options), mesh, options.rules, options.use_ocdbt,
                                             options.use_zarr3));
  item.sync();
}

}  // namespace
}  // namespace detail

struct CheckpointWriter::Impl {
  SaveOptions options;
  detail::ItemLayout layout;
  std::optional<detail::KeyWriter> out;  // this process's keys
  int64_t init_ns = 0;
};

CheckpointWriter::CheckpointWriter(Location dir, const State& abstract, SaveOptions options, ProcessGroup* group)
    : StateWriter(std::move(dir), detail::kTmpSuffix, abstract, group, options.durable, /*fixed_shardings=*/true),
      impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->init_ns = detail::now_ns();
  // Every process derives the same layout; its errors come before anything is written.
  impl_->layout = detail::layout_of(layout(), impl_->options);
  start();
}

CheckpointWriter::~CheckpointWriter() { impl_->out.reset(); }

void CheckpointWriter::begin_process() {
  Impl& w = *impl_;
  w.out.emplace(out(), w.options, group().index());
  if (!group().is_leader()) return;
  for (size_t i = 0; i < w.layout.records.size(); ++i) detail::put_zarr_metadata(*w.out, w.layout.records[i], w.layout.zarrs[i]);
}

std::optional<Shape> CheckpointWriter::block_grid(size_t leaf) const {
  auto it = impl_->options.block_shapes.find(paths()[leaf]);
  if (it == impl_->options.block_shapes.end()) return std::nullopt;
  return it->second;
}

void CheckpointWriter::write_blocks(size_t leaf, std::span<const HostBlock> blocks) {
  Impl& w = *impl_;
  detail::write_chunks(*w.out, blocks, layout().at(paths()[leaf]).dtype(), w.layout.zarrs[leaf], w.layout.records[leaf],
                       w.options);
}

std::string CheckpointWriter::finish_process() {
  Impl& w = *impl_;
  w.out->finish();
  w.out.reset();
  nlohmann::json crcs = nlohmann::json::object();
  for (const detail::ParamRecord& r : w.layout.records) {
    if (!r.crc32c.empty()) crcs[r.name] = r.crc32c;
  }
  return crcs.dump();
}

void CheckpointWriter::finish(const std::vector<std::string>& parts) {
  Impl& w = *impl_;
  std::map<std::string, detail::ParamRecord*> by_name;
  for (detail::ParamRecord& r : w.layout.records) by_name[r.name] = &r;
  for (size_t process = 0; process < parts.size(); ++process) {
    const std::string what = "the chunk checksums of process " + std::to_string(process);
    const nlohmann::json j = json_util::parse(parts[process], what);
    for (const auto& [name, chunks] : j.items()) {
      auto it = by_name.find(name);
      if (it == by_name.end()) throw ValueError(what + " name '" + name + "', which this process does not save");
      for (const auto& [key, crc] : chunks.items()) it->second->crc32c[key] = crc.get<uint32_t>();
    }
  }
  if (w.options.use_ocdbt) {
    std::vector<std::string> dbs;
    for (size_t process = 0; process < parts.size(); ++process)
      dbs.push_back(detail::KeyWriter::process_db(static_cast<int>(process)));
    detail::merge_ocdbt(tmp(), dbs, detail::KeyWriter::ocdbt_options(w.options));
  }
  const auto& records = w.layout.records;
  detail::write_item_metadata(out(), records, records.empty() ? Mesh({}) : records.front().sharding.mesh(), w.options);
  if (w.options.checkpoint_metadata)
    out().write(detail::kCheckpointMetadata, detail::checkpoint_metadata_json({}, w.init_ns, detail::now_ns()));
  // In a bucket StateWriter::commit writes it, last.
  if (dir().is_local()) out().write(detail::kCommitFile, "Checkpoint commit was successful to " + dir().string());
}

void save(const Location& dir, const StagedState& staged, const SaveOptions& options) {
  CheckpointWriter writer(dir, staged.abstract(), options, &staged.processes());
  staged.write_to(writer);
  writer.commit();
}

void save(const Location& dir, const State& state, const SaveOptions& options) {
  save(dir, stage_in_place(state), options);
}

}  // namespace tessel
