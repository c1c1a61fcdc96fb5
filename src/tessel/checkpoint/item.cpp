// Opening a checkpoint item: the one place its format is detected and its metadata, store and
// array metadata are read.
#include "tessel/checkpoint/item.h"

#include <algorithm>
#include <array>
#include <exception>
#include <set>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/store/chunks.h"
#include "tessel/checkpoint/detail/store/kvstore.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/checkpoint/items.h"
#include "tessel/core/error.h"
#include "tessel/core/path.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxMetadataBytes = int64_t{1} << 30;
constexpr int64_t kMaxZarrMetadataBytes = int64_t{1} << 20;

// A safetensors file or set as an item: one leaf per tensor, its levels the name's '.'-parts.
ItemMetadata safetensors_metadata(const detail::SafetensorsSet& set) {
  ItemMetadata item;
  item.format = StorageFormat::kSafetensors;
  item.format_metadata = set.metadata;
  for (const detail::SafetensorsTensor& t : set.tensors) {
    ParamMetadata p;
    p.name = t.name;
    for (std::string_view level : text_util::split(t.name, '.')) {
      p.keys.emplace_back(level);
      p.key_types.push_back(kDictKey);
    }
    for (const std::string& k : p.keys) p.path += (p.path.empty() ? "" : "/") + k;
    p.value_type = ValueType::kJaxArray;
    p.write_shape = t.shape;
    p.dtype = t.dtype;
    item.params.push_back(std::move(p));
  }
  std::sort(item.params.begin(), item.params.end(),
            [](const ParamMetadata& a, const ParamMetadata& b) { return PathLess()(a.path, b.path); });
  return item;
}

// The keys of the arrays' zarr metadata below a plain-files item: `<name>/.zarray`, `<name>/zarr.json`.
std::vector<std::string> array_keys_in_files(const Location& dir) {
  std::vector<std::string> keys;
  if (!detail::is_directory(dir)) return keys;
  for (const auto& e : detail::list_directory(dir)) {
    if (!e.is_directory) continue;
    for (const char* f : {".zarray", "zarr.json"}) {
      if (detail::is_file(dir / e.name / f)) keys.push_back(e.name + "/" + f);
    }
  }
  return keys;
}

// `_METADATA` (or, for an item that lost it, the tree its arrays' names give) and `_sharding`.
ItemMetadata orbax_metadata(const Location& dir, const detail::KvStore& store) {
  const Location meta = dir / "_METADATA";
  const bool ocdbt = store.is_ocdbt();
  const std::string sharding = detail::read_small(dir / "_sharding", kMaxMetadataBytes).value_or("");
  const std::optional<std::string> meta_text = detail::read_small(meta, kMaxMetadataBytes);
  if (!meta_text) {
    // Orbax can restore such an item when it is told the tree; tessel rebuilds the tree from the
    // arrays' names (each '.' a level, as Orbax joins them).
    std::vector<std::string> keys;
    if (ocdbt) {
      for (const auto& e : store.database()->entries()) keys.push_back(e.key);
    } else {
      keys = array_keys_in_files(dir);
    }
    const std::string text = metadata_from_array_keys(keys, ocdbt);
    if (text.empty()) throw IoError("'" + dir.string() + "' has no _METADATA: it is not an Orbax PyTree checkpoint item");
    return parse_item_metadata(text, sharding, (dir / "(array names)").string());
  }
  ItemMetadata item = parse_item_metadata(*meta_text, sharding, meta.string());
  // Orbax decides by the manifest, as tessel does; a _METADATA that promises one is the one
  // critical file gone missing.
  if (item.use_ocdbt && !ocdbt) {
    throw ValueError(meta.string() + ": use_ocdbt is true but there is no manifest.ocdbt in '" + dir.string() +
                     "' (the OCDBT database is missing)");
  }
  item.use_ocdbt = ocdbt;
  return item;
}

std::string key_prefix(const ParamMetadata& p) { return p.name.empty() ? std::string() : p.name + "/"; }

// A leaf's zarr metadata: `.zarray` or `zarr.json` (the one _METADATA announces first); a
// safetensors tensor's is implied by its header.
detail::ZarrArray open_zarr(const detail::KvStore& store, const Location& dir, const ItemMetadata& item,
                            const ParamMetadata& p, bool has_aggregate) {
  if (item.format == StorageFormat::kSafetensors) return detail::ZarrArray::one_chunk(*p.write_shape, *p.dtype);
  if (!store.is_ocdbt() && dir.is_local()) detail::reject_symlink(detail::child_path(dir.local(), p.name, "parameter name"));
  const std::string prefix = key_prefix(p);
  std::string key;
  std::optional<std::string> text;
  if (!p.skip_deserialize) {
    for (const char* name : item.use_zarr3 ? std::array{"zarr.json", ".zarray"} : std::array{".zarray", "zarr.json"}) {
      key = prefix + name;
      text = store.get_small(key, kMaxZarrMetadataBytes);
      if (text) break;
    }
  }
  if (!text) {
    if (p.skip_deserialize || has_aggregate) {
      throw ValueError("'" + p.path + "' is not stored as a zarr array in '" + dir.string() +
                       "' (an Orbax aggregate msgpack value, which tessel does not read); restore the other "
                       "leaves with partial");
    }
    throw ValueError("'" + p.path + "' has no array data: neither " + store.describe(prefix + ".zarray") + " nor " +
                     store.describe(prefix + "zarr.json") + " exists");
  }
  detail::ZarrArray z = detail::ZarrArray::parse(*text, store.describe(key));
  if (p.write_shape && p.write_shape->rank() != z.shape().rank()) {
    throw ValueError("'" + p.path + "': _METADATA gives write_shape " + p.write_shape->to_string() + " but " + key +
                     " has shape " + z.shape().to_string());
  }
  return z;
}

}  // namespace

struct CheckpointItem::Impl {
  Location dir;
  ItemMetadata meta;
  detail::KvStore store;
  // Per entry of meta.params: its zarr array, or what opening it threw (an empty node has neither).
  std::vector<std::optional<detail::ZarrArray>> arrays;
  std::vector<std::exception_ptr> errors;

  size_t index_of(const ParamMetadata& leaf) const {
    const auto i = static_cast<size_t>(&leaf - meta.params.data());
    if (i >= meta.params.size()) throw ValueError("'" + leaf.path + "' is not a leaf of '" + dir.string() + "'");
    return i;
  }
};

CheckpointItem CheckpointItem::open(const Location& item_dir) {
  auto impl = std::make_shared<Impl>();
  impl->dir = item_dir;
  const Location& dir = impl->dir;
  if (detail::is_safetensors(dir)) {
    const detail::SafetensorsSet set = detail::open_safetensors(dir);
    impl->meta = safetensors_metadata(set);
    impl->store = detail::KvStore::safetensors(set);
  } else {
    impl->store = detail::is_file(dir / "manifest.ocdbt") ? detail::KvStore::ocdbt(dir) : detail::KvStore::files(dir);
    impl->meta = orbax_metadata(dir, impl->store);
  }
  const std::vector<ParamMetadata>& params = impl->meta.params;
  // Orbax's aggregate file of values not stored as arrays (old checkpoints).
  const bool has_aggregate = impl->meta.format != StorageFormat::kSafetensors && detail::is_file(dir / "checkpoint");
  impl->arrays.resize(params.size());
  impl->errors.resize(params.size());
  auto open_one = [&](int64_t n) {
    const auto i = static_cast<size_t>(n);
    if (is_empty_node(params[i].value_type) && params[i].skip_deserialize) return;
    try {
      impl->arrays[i] = open_zarr(impl->store, dir, impl->meta, params[i], has_aggregate);
    } catch (const Error&) {
      impl->errors[i] = std::current_exception();
    }
  };
  // In a bucket each array's metadata (and, for plain files, its listing) is a round trip or two:
  // asked one after another, an item of thousands of arrays in a far bucket opened in minutes.
  const bool remote = !dir.is_local() && impl->meta.format != StorageFormat::kSafetensors && !impl->store.is_ocdbt();
  detail::run_parallel(static_cast<int64_t>(params.size()), remote ? detail::default_threads(0, 16) : 1, open_one);
  CheckpointItem item;
  item.impl_ = std::move(impl);
  return item;
}

CheckpointItem CheckpointItem::find(const Location& path, std::optional<int64_t> step,
                                    const std::optional<std::string>& item) {
  return open(find_item_dir(path, step, item));
}

const Location& CheckpointItem::dir() const { return impl_->dir; }
const ItemMetadata& CheckpointItem::metadata() const { return impl_->meta; }
const detail::KvStore& CheckpointItem::store() const { return impl_->store; }

std::string CheckpointItem::storage() const {
  const ItemMetadata& m = metadata();
  if (m.format == StorageFormat::kSafetensors) return "safetensors";
  return std::string(m.use_ocdbt ? "OCDBT" : "files") + ", " + (m.use_zarr3 ? "zarr3" : "zarr v2");
}

const detail::ZarrArray& CheckpointItem::zarr(const ParamMetadata& leaf) const {
  const size_t i = impl_->index_of(leaf);
  if (impl_->errors[i]) std::rethrow_exception(impl_->errors[i]);
  if (!impl_->arrays[i]) {
    throw ValueError("'" + leaf.path + "' is an empty node of the tree (" + std::string(value_type_name(leaf.value_type)) +
                     "), not an array");
  }
  return *impl_->arrays[i];
}

detail::ChunkSource CheckpointItem::chunks(const ParamMetadata& leaf) const {
  return {leaf.path, &impl_->store, key_prefix(leaf), zarr(leaf), &leaf.crc32c};
}

State CheckpointItem::abstract_state() const {
  State out;
  for (const ParamMetadata& p : metadata().params) {
    if (p.skip_deserialize || !holds_array(p.value_type)) continue;
    const detail::ZarrArray& z = zarr(p);
    std::optional<NamedSharding> s;
    if (p.sharding) s = NamedSharding(p.sharding->mesh, p.sharding->spec);
    out.insert(p.path, Variable::abstract(p.kind, z.shape(), z.dtype(), s, p.partitioning));
  }
  return out;
}

std::vector<SavedArrayInfo> CheckpointItem::describe() const {
  std::vector<SavedArrayInfo> out;
  for (const ParamMetadata& p : metadata().params) {
    if (p.skip_deserialize || !holds_array(p.value_type)) continue;
    const detail::ZarrArray& z = zarr(p);
    SavedArrayInfo info{p, z.shape(), z.dtype(), z.chunks(), z.compression(), z.num_chunks(), 0};
    std::set<std::string> keys;  // a zarr3 shard holds several chunks
    for (const auto& index : z.chunks_in(Box::full(z.shape()))) keys.insert(z.chunk_key(index));
    for (const auto& key : keys) {
      if (const auto v = store().get(key_prefix(p) + key)) info.stored_bytes += v->size();
    }
    out.push_back(std::move(info));
  }
  return out;
}

ItemMetadata read_item_metadata(const Location& item_dir) { return CheckpointItem::open(item_dir).metadata(); }

}  // namespace tessel
