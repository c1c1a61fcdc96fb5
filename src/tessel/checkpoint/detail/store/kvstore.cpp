#include "tessel/checkpoint/detail/store/kvstore.h"

#include <cstring>
#include <vector>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;

StoredValue::StoredValue(std::shared_ptr<const ByteSource> file, int64_t offset, int64_t size, std::string where)
    : file_(std::move(file)), offset_(offset), size_(size), where_(std::move(where)) {}

StoredValue::StoredValue(std::shared_ptr<const std::string> bytes, std::string where)
    : bytes_(std::move(bytes)), size_(static_cast<int64_t>(bytes_->size())), where_(std::move(where)) {}

void StoredValue::read(int64_t offset, std::span<std::byte> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > size_ || n > size_ - offset) {
    throw IoError(where_ + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                  ") asked of a value of " + std::to_string(size_));
  }
  if (bytes_) {
    if (n > 0) std::memcpy(out.data(), bytes_->data() + offset_ + offset, out.size());
    return;
  }
  file_->read_exact(offset_ + offset, out);
}

void StoredValue::read_scatter(int64_t offset, std::span<const iovec> buffers) const {
  if (!bytes_) {
    int64_t n = 0;
    for (const iovec& v : buffers) n += static_cast<int64_t>(v.iov_len);
    if (offset < 0 || offset > size_ || n > size_ - offset) {
      throw IoError(where_ + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                    ") asked of a value of " + std::to_string(size_));
    }
    file_->read_scatter(offset_ + offset, buffers);
    return;
  }
  for (const iovec& v : buffers) {
    read(offset, {static_cast<std::byte*>(v.iov_base), v.iov_len});
    offset += static_cast<int64_t>(v.iov_len);
  }
}

StoredValue StoredValue::slice(int64_t offset, int64_t size, std::string where) const {
  if (offset < 0 || size < 0 || offset > size_ || size > size_ - offset) {
    throw ValueError(where + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + size) +
                     ") lie outside " + where_ + " (" + std::to_string(size_) + " bytes)");
  }
  StoredValue v = *this;
  v.offset_ += offset;
  v.size_ = size;
  v.where_ = std::move(where);
  return v;
}

KvStore KvStore::files(const Location& dir) {
  KvStore s;
  s.dir_ = dir;
  if (!dir.is_local()) s.listings_ = std::make_shared<Listings>();
  return s;
}

const KvStore::Listing& KvStore::listing(std::string_view dir) const {
  std::shared_ptr<Listing> l;
  {
    std::lock_guard lock(listings_->mu);
    auto it = listings_->by_dir.find(dir);
    if (it == listings_->by_dir.end()) it = listings_->by_dir.emplace(std::string(dir), std::make_shared<Listing>()).first;
    l = it->second;
  }
  // Outside the map's lock: a bucket answers slowly; threads asking the same directory wait here.
  std::call_once(l->once, [&] { l->sizes = list_objects(nested_location(dir_, dir, "key '" + std::string(dir) + "'")); });
  return *l;  // by_dir holds it as long as the store
}

const std::map<std::string, int64_t, std::less<>>* KvStore::whole_listing() const {
  // S3's and GCS's largest listing page.
  constexpr int kPage = 1000;
  std::call_once(listings_->whole_once, [&] { listings_->whole = list_objects_if_fewer(dir_, kPage); });
  return listings_->whole ? &*listings_->whole : nullptr;
}

KvStore KvStore::ocdbt(const Location& dir) {
  KvStore s;
  s.dir_ = dir;
  s.db_ = std::make_shared<const OcdbtDatabase>(OcdbtDatabase::open(dir));
  s.open_files_ = std::make_shared<OpenFiles>();
  return s;
}

std::shared_ptr<const ByteSource> KvStore::data_file(const OcdbtEntry& e) const {
  {
    std::lock_guard lock(open_files_->mu);
    if (auto it = open_files_->by_name.find(e.file); it != open_files_->by_name.end()) return it->second;
  }
  auto file = open_source(db_->data_file(e));  // outside the lock: a bucket answers slowly
  std::lock_guard lock(open_files_->mu);
  return open_files_->by_name.emplace(e.file, std::move(file)).first->second;
}

KvStore KvStore::safetensors(const SafetensorsSet& set) {
  KvStore s;
  s.dir_ = set.source;
  std::vector<std::shared_ptr<const ByteSource>> files;
  for (const Location& f : set.files) files.push_back(open_source(f));
  auto tensors = std::make_shared<std::map<std::string, StoredValue, std::less<>>>();
  for (const SafetensorsTensor& t : set.tensors) {
    // Each tensor is the single chunk of an array; its key is that chunk's.
    const ZarrArray z = ZarrArray::one_chunk(t.shape, t.dtype);
    const std::string key = t.name + "/" + z.chunk_key(std::vector<int64_t>(t.shape.rank(), 0));
    const std::string where = "tensor '" + t.name + "' of " + set.files[t.file].string();
    tensors->emplace(key, StoredValue(files[t.file], set.data_starts[t.file] + t.begin, t.end - t.begin, where));
  }
  s.tensors_ = std::move(tensors);
  return s;
}

std::string KvStore::describe(std::string_view key) const {
  if (tensors_) {
    auto it = tensors_->find(key);
    return it != tensors_->end() ? it->second.where() : "key '" + std::string(key) + "' of " + dir_.string();
  }
  if (db_) return "key '" + std::string(key) + "' of the OCDBT database in " + dir_.string();
  return dir_.is_local() ? (dir_.local() / std::string(key)).string() : dir_.string() + "/" + std::string(key);
}

std::optional<StoredValue> KvStore::get(std::string_view key) const {
  if (tensors_) {
    auto it = tensors_->find(key);
    if (it == tensors_->end()) return std::nullopt;
    return it->second;
  }
  if (db_) {
    const OcdbtEntry* e = db_->find(key);
    if (!e) return std::nullopt;
    if (e->is_inline) {
      return StoredValue(std::shared_ptr<const std::string>(db_, &e->value), describe(key));
    }
    if (e->length == 0) return StoredValue(std::make_shared<const std::string>(), describe(key));
    auto file = data_file(*e);
    if (e->offset > static_cast<uint64_t>(file->size()) || e->length > static_cast<uint64_t>(file->size()) - e->offset) {
      throw ValueError(describe(key) + ": its bytes [" + std::to_string(e->offset) + ", " +
                       std::to_string(e->offset + e->length) + ") lie past the end of " + file->where() + " (" +
                       std::to_string(file->size()) + " bytes)");
    }
    const std::string where = describe(key) + " (" + file->where() + ")";
    return StoredValue(std::move(file), static_cast<int64_t>(e->offset), static_cast<int64_t>(e->length), where);
  }
  const Location f = nested_location(dir_, key, "key '" + std::string(key) + "'");
  if (listings_) {
    auto listed = [&](const std::map<std::string, int64_t, std::less<>>& sizes,
                      std::string_view name) -> std::optional<StoredValue> {
      const auto it = sizes.find(name);
      if (it == sizes.end()) return std::nullopt;
      return StoredValue(open_listed(f, it->second), 0, it->second, f.string());
    };
    if (const auto* whole = whole_listing()) return listed(*whole, key);
    if (const size_t slash = key.find('/'); slash != std::string_view::npos)
      return listed(listing(key.substr(0, slash)).sizes, key.substr(slash + 1));
  }
  auto file = open_if_exists(f);
  if (!file) return std::nullopt;
  const int64_t size = file->size();
  return StoredValue(std::move(file), 0, size, f.string());
}

std::optional<std::string> KvStore::get_small(std::string_view key, int64_t max_bytes) const {
  const auto v = get(key);
  if (!v) return std::nullopt;
  if (v->size() > max_bytes) {
    throw ValueError(v->where() + ": " + std::to_string(v->size()) + " bytes, more than the " + std::to_string(max_bytes) +
                     " a metadata value may have");
  }
  std::string out(static_cast<size_t>(v->size()), '\0');
  v->read(0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
  return out;
}

}  // namespace tessel::detail
