// Reading OCDBT: manifests, version nodes and B+tree nodes decoded from untrusted bytes, and a
// database walked into its keys.
#include "tessel/checkpoint/detail/store/ocdbt.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/store/ocdbt_format.h"
#include "tessel/core/error.h"

namespace tessel::detail {
namespace fs = std::filesystem;

using namespace ocdbt_format;

namespace {

// A cursor over untrusted bytes: every read checks what is left.
class Reader {
 public:
  Reader(std::span<const std::byte> data, std::string_view what) : data_(data), what_(what) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw ValueError(std::string(what_) + ": " + problem + " (at byte " + std::to_string(pos_) + ")");
  }
  size_t left() const { return data_.size() - pos_; }
  bool done() const { return pos_ == data_.size(); }

  uint8_t byte(const char* field) {
    if (left() < 1) fail(std::string("truncated before ") + field);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t varint(const char* field, uint64_t max = UINT64_MAX) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (shift > 63) fail(std::string("varint too long in ") + field);
      const uint8_t b = byte(field);
      const uint64_t bits = b & 0x7f;
      if (shift == 63 && bits > 1) fail(std::string("varint overflows 64 bits in ") + field);
      v |= bits << shift;
      if (!(b & 0x80)) break;
    }
    if (v > max) fail(std::string(field) + " " + std::to_string(v) + " exceeds " + std::to_string(max));
    return v;
  }
  uint64_t u64le(const char* field) { return fixed_le(8, field); }
  uint32_t u32le(const char* field) { return static_cast<uint32_t>(fixed_le(4, field)); }
  std::string bytes(uint64_t n, const char* field) {
    if (n > left()) fail(std::string("truncated in ") + field + " (" + std::to_string(n) + " bytes wanted, " +
                         std::to_string(left()) + " left)");
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  // A count of entries that each take at least one more byte: bounded by what is left.
  uint64_t count(const char* field, uint64_t max) {
    return varint(field, std::min<uint64_t>(max, left()));
  }

 private:
  uint64_t fixed_le(size_t n, const char* field) {
    if (left() < n) fail(std::string("truncated before ") + field);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(data_[pos_ + i]);
    pos_ += n;
    return v;
  }

  std::span<const std::byte> data_;
  size_t pos_ = 0;
  std::string_view what_;
};

// Checks the common envelope (magic, length, version, CRC-32C) and returns the body, decoded.
std::vector<std::byte> open_envelope(std::span<const std::byte> blob, uint32_t magic, uint64_t max_body,
                                     std::string_view what) {
  const std::string w(what);
  if (blob.size() < 18) throw ValueError(w + ": " + std::to_string(blob.size()) + " bytes, too short for an OCDBT blob");
  uint32_t got = 0;
  for (int i = 0; i < 4; ++i) got = (got << 8) | static_cast<uint8_t>(blob[static_cast<size_t>(i)]);
  if (got != magic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "magic 0x%08x, expected 0x%08x", got, magic);
    throw ValueError(w + ": " + buf + " (not this kind of OCDBT blob)");
  }
  Reader header(blob.subspan(4), what);
  const uint64_t length = header.u64le("length");
  if (length != blob.size()) {
    throw ValueError(w + ": the header gives length " + std::to_string(length) + " but the blob has " +
                     std::to_string(blob.size()) + " bytes (truncated or wrongly referenced)");
  }
  const uint32_t crc = Reader(blob.last(4), what).u32le("CRC-32C");
  if (detail::crc32c(blob.first(blob.size() - 4)) != crc) throw ValueError(w + ": CRC-32C mismatch (corrupt)");
  Reader r(blob.subspan(12, blob.size() - 16), what);
  const uint64_t version = r.varint("format version");
  if (version != 0) r.fail("format version " + std::to_string(version) + ", only 0 is known");
  const uint64_t compression = r.varint("compression");
  const size_t start = 12 + (blob.size() - 16 - r.left());
  std::span<const std::byte> stored = blob.subspan(start, blob.size() - 4 - start);
  if (compression == 0) {
    if (stored.size() > max_body) r.fail("body of " + std::to_string(stored.size()) + " bytes exceeds the limit");
    return {stored.begin(), stored.end()};
  }
  if (compression != 1) r.fail("compression " + std::to_string(compression) + " (known: 0 raw, 1 zstd)");
  std::unique_ptr<ZSTD_DStream, decltype(&ZSTD_freeDStream)> z(ZSTD_createDStream(), ZSTD_freeDStream);
  std::vector<std::byte> out;
  ZSTD_inBuffer in{stored.data(), stored.size(), 0};
  size_t ret = 1;
  std::vector<std::byte> chunk(ZSTD_DStreamOutSize());
  while (in.pos < in.size || ret != 0) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    ret = ZSTD_decompressStream(z.get(), &o, &in);
    if (ZSTD_isError(ret)) throw ValueError(w + ": zstd body is corrupt (" + ZSTD_getErrorName(ret) + ")");
    if (out.size() + o.pos > max_body) {
      throw ValueError(w + ": body decodes to more than " + std::to_string(max_body) + " bytes");
    }
    out.insert(out.end(), chunk.begin(), chunk.begin() + static_cast<ptrdiff_t>(o.pos));
    if (in.pos == in.size && ret != 0 && o.pos == 0) throw ValueError(w + ": zstd body is truncated");
  }
  return out;
}

struct DataFile {
  std::string base, relative;
};

// The data file table (3.3): paths prefix-compressed against the previous one; `transitive` is
// prepended to every base.
std::vector<DataFile> read_table(Reader& r, std::string_view transitive) {
  const uint64_t n = r.count("data file count", UINT32_MAX);
  std::vector<uint64_t> prefix(n, 0), suffix(n), base(n);
  for (uint64_t i = 1; i < n; ++i) prefix[i] = r.varint("path prefix length", 65535);
  for (uint64_t i = 0; i < n; ++i) suffix[i] = r.varint("path suffix length", 65535);
  for (uint64_t i = 0; i < n; ++i) base[i] = r.varint("base path length", 65535);
  std::vector<DataFile> out;
  std::string prev;
  uint64_t prev_base = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (prefix[i] > prev.size()) r.fail("data file path prefix longer than the previous path");
    if (i > 0 && base[i] != prev_base && prefix[i] > std::min(prev_base, base[i])) {
      r.fail("data file path prefix runs into a different base path");
    }
    std::string path = prev.substr(0, static_cast<size_t>(prefix[i])) + r.bytes(suffix[i], "data file path");
    if (path.size() > 65535) r.fail("data file path longer than 65535 bytes");
    if (base[i] > path.size()) r.fail("base path length exceeds the path");
    out.push_back({std::string(transitive) + path.substr(0, static_cast<size_t>(base[i])),
                   path.substr(static_cast<size_t>(base[i]))});
    prev = std::move(path);
    prev_base = base[i];
  }
  return out;
}

const DataFile& table_entry(Reader& r, const std::vector<DataFile>& table, uint64_t id) {
  if (id >= table.size()) {
    r.fail("data file id " + std::to_string(id) + " outside the table of " + std::to_string(table.size()));
  }
  return table[static_cast<size_t>(id)];
}

OcdbtConfig read_config(Reader& r) {
  OcdbtConfig c;
  const std::string uuid = r.bytes(16, "uuid");
  std::memcpy(c.uuid.data(), uuid.data(), 16);
  c.manifest_kind = r.byte("manifest kind");
  if (c.manifest_kind > 1) r.fail("manifest kind " + std::to_string(c.manifest_kind) + " (known: 0 single, 1 numbered)");
  c.max_inline_value_bytes = r.varint("max_inline_value_bytes", kMaxInlineValue);
  c.max_decoded_node_bytes = r.varint("max_decoded_node_bytes", UINT32_MAX);
  c.version_tree_arity_log2 = r.byte("version_tree_arity_log2");
  if (c.version_tree_arity_log2 < 1 || c.version_tree_arity_log2 > 16) {
    r.fail("version_tree_arity_log2 " + std::to_string(c.version_tree_arity_log2) + " outside 1..16");
  }
  const uint64_t method = r.varint("compression method");
  if (method > 1) r.fail("compression method " + std::to_string(method) + " (known: 0 none, 1 zstd)");
  c.zstd = method == 1;
  if (c.zstd) c.zstd_level = static_cast<int32_t>(r.u32le("zstd level"));
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoders

namespace {

std::vector<OcdbtVersion> read_leaf_versions(Reader& r, const std::vector<DataFile>& table) {
  const uint64_t n = r.count("version count", UINT32_MAX);
  std::vector<OcdbtVersion> v(static_cast<size_t>(n));
  for (auto& e : v) e.generation = r.varint("generation number");
  for (auto& e : v) e.root_height = r.byte("root height");
  std::vector<uint64_t> ids(v.size());
  for (auto& id : ids) id = r.varint("data file id");
  for (auto& e : v) e.root_offset = r.varint("root offset");
  for (auto& e : v) e.root_length = r.varint("root length");
  for (auto& e : v) e.num_keys = r.varint("num_keys");
  for (auto& e : v) e.num_tree_bytes = r.varint("num_tree_bytes");
  for (auto& e : v) e.num_indirect_value_bytes = r.varint("num_indirect_value_bytes");
  for (auto& e : v) e.commit_time_ns = r.u64le("commit time");
  for (size_t i = 0; i < v.size(); ++i) {
    const DataFile& f = table_entry(r, table, ids[i]);
    v[i].root_file = f.base + f.relative;
    v[i].root_base = f.base;
    if (v[i].generation == 0) r.fail("generation number 0");
    if (i > 0 && v[i].generation <= v[i - 1].generation) r.fail("generation numbers not increasing");
    const bool missing = v[i].root_offset == kMissing && v[i].root_length == kMissing;
    if (missing != v[i].root_file.empty()) {
      r.fail("generation " + std::to_string(v[i].generation) +
             (missing ? ": an empty tree whose root names a data file" : ": a root without a data file"));
    }
    if (!missing && (v[i].root_offset > INT64_MAX || v[i].root_length > INT64_MAX - v[i].root_offset)) {
      r.fail("root range past 2^63");
    }
  }
  return v;
}

std::vector<OcdbtManifest::VersionNode> read_interior_versions(Reader& r, const std::vector<DataFile>& table,
                                                               bool heights) {
  const uint64_t n = r.count("version node count", UINT32_MAX);
  std::vector<OcdbtManifest::VersionNode> v(static_cast<size_t>(n));
  std::vector<uint64_t> ids(v.size());
  for (auto& e : v) e.latest_generation = r.varint("version node generation");
  for (auto& id : ids) id = r.varint("version node file id");
  for (auto& e : v) e.offset = r.varint("version node offset");
  for (auto& e : v) e.length = r.varint("version node length");
  for (auto& e : v) e.num_generations = r.varint("version node num_generations");
  for (size_t i = 0; i < v.size(); ++i) r.u64le("version node commit time");
  if (heights) {
    for (auto& e : v) e.height = r.byte("version node height");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const DataFile& f = table_entry(r, table, ids[i]);
    v[i].file = f.base + f.relative;
    v[i].base = f.base;
    if (v[i].num_generations == 0 || v[i].num_generations > v[i].latest_generation) {
      r.fail("version node covers " + std::to_string(v[i].num_generations) + " generations up to " +
             std::to_string(v[i].latest_generation));
    }
    if (v[i].offset > INT64_MAX || v[i].length > INT64_MAX - v[i].offset) r.fail("version node range past 2^63");
    if (heights && v[i].height == 0) r.fail("version node of height 0 in the manifest");
    if (heights && i > 0 && v[i].height >= v[i - 1].height) r.fail("version node heights not decreasing");
  }
  return v;
}

}  // namespace

OcdbtManifest decode_ocdbt_manifest(std::span<const std::byte> blob, std::string_view what) {
  const std::vector<std::byte> body = open_envelope(blob, kManifestMagic, kMaxManifestBytes, what);
  Reader r(body, what);
  OcdbtManifest m;
  m.config = read_config(r);
  if (m.config.manifest_kind == 1 && r.done()) return m;  // numbered: the config alone
  const std::vector<DataFile> table = read_table(r, "");
  m.versions = read_leaf_versions(r, table);
  m.version_nodes = read_interior_versions(r, table, true);
  if (!r.done()) r.fail("bytes left after the manifest");
  return m;
}

OcdbtNode decode_ocdbt_node(std::span<const std::byte> blob, std::string_view base, uint64_t max_decoded_bytes,
                            std::string_view what) {
  const std::vector<std::byte> body = open_envelope(blob, kBtreeNodeMagic, std::min(max_decoded_bytes, kMaxNodeBytes), what);
  Reader r(body, what);
  OcdbtNode node;
  node.height = r.byte("height");
  const std::vector<DataFile> table = read_table(r, base);
  const uint64_t n = r.varint("entry count", kMaxEntries);
  if (n == 0) r.fail("a node without entries");
  if (n > r.left()) r.fail("more entries than bytes");
  const size_t count = static_cast<size_t>(n);
  std::vector<uint64_t> prefix(count, 0), suffix(count), common(count, 0);
  for (size_t i = 1; i < count; ++i) prefix[i] = r.varint("key prefix length", 65535);
  for (size_t i = 0; i < count; ++i) suffix[i] = r.varint("key suffix length", 65535);
  if (node.height > 0) {
    for (size_t i = 0; i < count; ++i) common[i] = r.varint("subtree common prefix length", 65535);
  }
  std::vector<std::string> keys(count);
  for (size_t i = 0; i < count; ++i) {
    if (i > 0 && prefix[i] > keys[i - 1].size()) r.fail("key prefix longer than the previous key");
    keys[i] = (i > 0 ? keys[i - 1].substr(0, static_cast<size_t>(prefix[i])) : std::string()) + r.bytes(suffix[i], "key");
    if (keys[i].size() > 65535) r.fail("key longer than 65535 bytes");
    if (i > 0 && keys[i] <= keys[i - 1]) r.fail("keys not strictly increasing");
    if (common[i] > keys[i].size()) r.fail("subtree common prefix longer than its key");
  }
  if (node.height == 0) {
    std::vector<uint64_t> length(count);
    std::vector<uint8_t> kind(count);
    for (auto& l : length) l = r.varint("value length");
    size_t indirect = 0;
    for (auto& k : kind) {
      k = r.byte("value kind");
      if (k > 1) r.fail("value kind " + std::to_string(k) + " (known: 0 inline, 1 out of line)");
      indirect += k;
    }
    std::vector<uint64_t> ids(indirect), offsets(indirect);
    for (auto& id : ids) id = r.varint("value data file id");
    for (auto& o : offsets) o = r.varint("value offset");
    node.entries.resize(count);
    size_t k = 0;
    for (size_t i = 0; i < count; ++i) {
      OcdbtEntry& e = node.entries[i];
      e.key = std::move(keys[i]);
      e.length = length[i];
      e.is_inline = kind[i] == 0;
      if (e.is_inline) {
        if (length[i] > kMaxInlineValue) r.fail("inline value of " + std::to_string(length[i]) + " bytes");
        e.value = r.bytes(length[i], "inline value");
      } else {
        const DataFile& f = table_entry(r, table, ids[k]);
        e.file = f.base + f.relative;
        e.offset = offsets[k++];
        if (e.offset > INT64_MAX || e.length > INT64_MAX - e.offset) r.fail("value range past 2^63");
      }
    }
  } else {
    node.children.resize(count);
    std::vector<uint64_t> ids(count);
    for (auto& id : ids) id = r.varint("child data file id");
    for (auto& c : node.children) c.offset = r.varint("child offset");
    for (auto& c : node.children) c.length = r.varint("child length");
    for (auto& c : node.children) c.num_keys = r.varint("child num_keys");
    for (size_t i = 0; i < count; ++i) r.varint("child num_tree_bytes");
    for (size_t i = 0; i < count; ++i) r.varint("child num_indirect_value_bytes");
    for (size_t i = 0; i < count; ++i) {
      auto& c = node.children[i];
      const DataFile& f = table_entry(r, table, ids[i]);
      c.file = f.base + f.relative;
      c.base = f.base;
      c.key = std::move(keys[i]);
      c.common_prefix = static_cast<size_t>(common[i]);
    }
  }
  if (!r.done()) r.fail("bytes left after the node");
  return node;
}

// ---------------------------------------------------------------------------------------------
// The database

namespace {

// `relative` (a path read from the database) inside `dir`.
Location resolve(const Location& dir, std::string_view relative, std::string_view what) {
  if (relative.empty()) throw ValueError(std::string(what) + ": an empty data file path");
  return detail::nested_location(dir, relative, std::string(what) + " data file path '" + std::string(relative) + "'");
}

std::vector<std::byte> read_range(const Location& dir, const std::string& file, uint64_t offset, uint64_t length,
                                  uint64_t max_length, const std::string& what) {
  if (length > max_length) {
    throw ValueError(what + ": " + std::to_string(length) + " bytes at " + file + ", more than the limit of " +
                     std::to_string(max_length));
  }
  const auto f = detail::open_source(resolve(dir, file, what));
  if (offset > static_cast<uint64_t>(f->size()) || length > static_cast<uint64_t>(f->size()) - offset) {
    throw ValueError(what + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ") of " +
                     file + ", which has " + std::to_string(f->size()) + " (truncated or wrongly referenced)");
  }
  std::vector<std::byte> out(static_cast<size_t>(length));
  f->read_exact(static_cast<int64_t>(offset), out);
  return out;
}

std::string describe(const Location& dir, const std::string& file, uint64_t offset) {
  return (dir / file).string() + " at " + std::to_string(offset);
}

// Numbered manifests: the newest `manifest.<016x>` beside the config-only `manifest.ocdbt`.
Location newest_numbered_manifest(const Location& dir) {
  std::string best;
  for (const auto& e : detail::list_directory(dir)) {
    const std::string& name = e.name;
    if (!e.is_directory && name.size() == 9 + 16 && name.starts_with("manifest.") &&
        name.find_first_not_of("0123456789abcdef", 9) == std::string::npos && name > best) {
      best = name;
    }
  }
  if (best.empty()) {
    throw ValueError((dir / "manifest.ocdbt").string() + " is a numbered manifest, but there is no manifest.<generation> beside it");
  }
  return dir / best;
}

// Finds `generation` below the manifest's version nodes.
OcdbtVersion find_in_version_nodes(const Location& dir, const OcdbtManifest& m, uint64_t generation) {
  std::vector<OcdbtManifest::VersionNode> level = m.version_nodes;
  int expected_height = -1;
  for (int depth = 0; depth < 64; ++depth) {
    const OcdbtManifest::VersionNode* hit = nullptr;
    for (const auto& n : level) {
      if (generation <= n.latest_generation && generation > n.latest_generation - n.num_generations) hit = &n;
    }
    if (!hit) break;
    const int height = expected_height < 0 ? hit->height : expected_height;
    const std::string what = "OCDBT version node " + describe(dir, hit->file, hit->offset);
    const auto blob = read_range(dir, hit->file, hit->offset, hit->length, kMaxManifestBytes, what);
    const auto body = open_envelope(blob, kVersionNodeMagic, kMaxManifestBytes, what);
    Reader r(body, what);
    const int arity = r.byte("version_tree_arity_log2");
    if (arity != m.config.version_tree_arity_log2) r.fail("arity differs from the manifest's");
    const int h = r.byte("height");
    if (h != height - 1) r.fail("height " + std::to_string(h) + ", expected " + std::to_string(height - 1));
    const std::vector<DataFile> table = read_table(r, hit->base);
    if (h == 0) {
      const auto versions = read_leaf_versions(r, table);
      if (!r.done()) r.fail("bytes left after the version node");
      for (const auto& v : versions) {
        if (v.generation == generation) return v;
      }
      break;
    }
    level = read_interior_versions(r, table, false);
    if (!r.done()) r.fail("bytes left after the version node");
    expected_height = h;
  }
  throw ValueError("the OCDBT database '" + dir.string() + "' has no generation " + std::to_string(generation));
}

struct Walk {
  const Location& dir;
  uint64_t max_node_bytes;
  std::vector<OcdbtEntry>& out;
  uint64_t keys_limit;

  // Appends the node's entries, full keys, in order; `lower` is the least key the parent allows.
  void node(const std::string& file, const std::string& base, uint64_t offset, uint64_t length, int height,
            const std::string& prefix, const std::string& lower) {
    const std::string what = "OCDBT B+tree node " + describe(dir, file, offset);
    const auto blob = read_range(dir, file, offset, length, kMaxNodeBytes, what);
    OcdbtNode n = decode_ocdbt_node(blob, base, max_node_bytes, what);
    if (n.height != height) {
      throw ValueError(what + ": height " + std::to_string(n.height) + ", its parent says " + std::to_string(height));
    }
    if (height == 0) {
      for (auto& e : n.entries) {
        e.key = prefix + e.key;
        if (!out.empty() && e.key <= out.back().key) throw ValueError(what + ": key '" + e.key + "' out of order");
        if (e.key < lower) throw ValueError(what + ": key '" + e.key + "' below its parent's bound");
        if (out.size() >= keys_limit) throw ValueError(what + ": more keys than the version declares");
        out.push_back(std::move(e));
      }
      return;
    }
    for (const auto& c : n.children) {
      const std::string child_prefix = prefix + c.key.substr(0, c.common_prefix);
      node(c.file, c.base, c.offset, c.length, height - 1, child_prefix, std::max(lower, prefix + c.key));
    }
  }
};

}  // namespace

OcdbtDatabase OcdbtDatabase::open(const Location& dir, std::optional<uint64_t> generation) {
  OcdbtDatabase db;
  db.dir_ = dir;
  Location manifest_path = dir / "manifest.ocdbt";
  auto blob_of = [](const Location& p) {
    const std::optional<std::string> found = detail::read_small(p, static_cast<int64_t>(kMaxManifestBytes));
    if (!found) throw IoError("'" + p.string() + "' does not exist");
    const std::string& text = *found;
    return std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                  reinterpret_cast<const std::byte*>(text.data()) + text.size());
  };
  OcdbtManifest m = decode_ocdbt_manifest(blob_of(manifest_path), manifest_path.string());
  if (m.config.manifest_kind == 1) {
    const OcdbtConfig config = m.config;
    manifest_path = newest_numbered_manifest(dir);
    m = decode_ocdbt_manifest(blob_of(manifest_path), manifest_path.string());
    if (m.config.uuid != config.uuid) throw ValueError(manifest_path.string() + ": another database's uuid");
    m.config = config;
  }
  db.config_ = m.config;
  db.inline_versions_ = m.versions;
  if (m.versions.empty()) throw ValueError(manifest_path.string() + ": no version");
  if (!generation || *generation == m.versions.back().generation) {
    db.version_ = m.versions.back();
  } else {
    auto it = std::find_if(m.versions.begin(), m.versions.end(), [&](const OcdbtVersion& v) { return v.generation == *generation; });
    db.version_ = it != m.versions.end() ? *it : find_in_version_nodes(dir, m, *generation);
  }
  if (db.version_.empty()) return db;
  Walk walk{dir, m.config.max_decoded_node_bytes, db.entries_, std::min(db.version_.num_keys, kMaxKeys)};
  walk.node(db.version_.root_file, db.version_.root_base, db.version_.root_offset, db.version_.root_length,
            db.version_.root_height, "", "");
  if (db.entries_.size() != db.version_.num_keys) {
    throw ValueError(manifest_path.string() + ": generation " + std::to_string(db.version_.generation) + " declares " +
                     std::to_string(db.version_.num_keys) + " keys, its tree holds " + std::to_string(db.entries_.size()));
  }
  return db;
}

const OcdbtEntry* OcdbtDatabase::find(std::string_view key) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const OcdbtEntry& e, std::string_view k) { return e.key < k; });
  return it != entries_.end() && it->key == key ? &*it : nullptr;
}

Location OcdbtDatabase::data_file(const OcdbtEntry& entry) const {
  return resolve(dir_, entry.file, "OCDBT value '" + entry.key + "'");
}

std::string OcdbtDatabase::read_all(const OcdbtEntry& entry) const {
  if (entry.is_inline) return entry.value;
  if (entry.length == 0) return {};
  const auto bytes = read_range(dir_, entry.file, entry.offset, entry.length, INT64_MAX,
                                "OCDBT value '" + entry.key + "'");
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace tessel::detail
